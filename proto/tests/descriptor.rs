//! Checks the encoded file descriptor set: that it holds every service, RPC and
//! file reflection needs, and that every element of `reconciled.v1` carries a
//! leading comment (grpcurl `describe` shows them to users).

use std::collections::{BTreeMap, BTreeSet};

use prost::Message as _;
use prost_types::{DescriptorProto, EnumDescriptorProto, FileDescriptorProto, FileDescriptorSet};
use reconciled_proto::FILE_DESCRIPTOR_SET;

// Field numbers of descriptor.proto used in `SourceCodeInfo` paths.
const FILE_MESSAGE_TYPE: i32 = 4;
const FILE_ENUM_TYPE: i32 = 5;
const FILE_SERVICE: i32 = 6;
const MESSAGE_FIELD: i32 = 2;
const MESSAGE_NESTED_TYPE: i32 = 3;
const MESSAGE_ENUM_TYPE: i32 = 4;
const MESSAGE_ONEOF_DECL: i32 = 8;
const ENUM_VALUE: i32 = 2;
const SERVICE_METHOD: i32 = 2;

fn descriptor_set() -> FileDescriptorSet {
    FileDescriptorSet::decode(FILE_DESCRIPTOR_SET).expect("FILE_DESCRIPTOR_SET decodes")
}

fn file<'a>(fds: &'a FileDescriptorSet, name: &str) -> &'a FileDescriptorProto {
    fds.file
        .iter()
        .find(|f| f.name() == name)
        .unwrap_or_else(|| panic!("{name} is in the descriptor set"))
}

fn idx(i: usize) -> i32 {
    i32::try_from(i).expect("index fits in i32")
}

#[test]
fn services_and_rpcs() {
    let fds = descriptor_set();
    let mut services: BTreeMap<String, Vec<(String, bool, bool)>> = BTreeMap::new();
    for f in &fds.file {
        for s in &f.service {
            let full = format!("{}.{}", f.package(), s.name());
            let methods = s
                .method
                .iter()
                .map(|m| {
                    (
                        m.name().to_owned(),
                        m.client_streaming(),
                        m.server_streaming(),
                    )
                })
                .collect();
            services.insert(full, methods);
        }
    }

    let expect = |service: &str, rpcs: &[(&str, bool, bool)]| {
        let methods = services
            .get(service)
            .unwrap_or_else(|| panic!("service {service} is in the descriptor set"));
        let want: Vec<(String, bool, bool)> = rpcs
            .iter()
            .map(|(n, c, s)| ((*n).to_owned(), *c, *s))
            .collect();
        assert_eq!(
            methods, &want,
            "RPCs of {service} (name, client streaming, server streaming)"
        );
    };
    expect(
        "reconciled.v1.Reconciler",
        &[
            ("SubmitIntent", false, false),
            ("Reconcile", false, false),
            ("Watch", false, true),
            ("GetGraph", false, false),
            ("GetStatus", false, false),
            ("ReportExternal", false, false),
            ("GetItemTypes", false, false),
        ],
    );
    expect("reconciled.v1.Configurators", &[("Connect", true, true)]);
    expect(
        "reconciled.v1.Tenants",
        &[
            ("CreateTenant", false, false),
            ("GetTenant", false, false),
            ("ListTenants", false, false),
            ("DeleteTenant", false, false),
            ("RotateToken", false, false),
            ("WatchFleet", false, true),
        ],
    );
    assert_eq!(
        services.len(),
        3,
        "no other services: {:?}",
        services.keys()
    );
}

#[test]
fn reflection_is_complete() {
    let fds = descriptor_set();
    let names: BTreeSet<&str> = fds.file.iter().map(FileDescriptorProto::name).collect();

    for name in [
        "google/rpc/status.proto",
        "google/rpc/error_details.proto",
        "reconciled/v1/model.proto",
        "reconciled/v1/watch.proto",
        "reconciled/v1/reconciler.proto",
        "reconciled/v1/configurators.proto",
        "reconciled/v1/tenants.proto",
    ] {
        assert!(names.contains(name), "{name} missing from {names:?}");
    }

    // Every import resolves inside the set, so reflection clients never meet
    // an unknown file (the well-known types are included too).
    for f in &fds.file {
        for dep in &f.dependency {
            assert!(
                names.contains(dep.as_str()),
                "{} imports {dep}, which is missing",
                f.name()
            );
        }
    }

    let status = file(&fds, "google/rpc/status.proto");
    assert_eq!(status.package(), "google.rpc");
    let msg = status
        .message_type
        .iter()
        .find(|m| m.name() == "Status")
        .expect("google.rpc.Status");
    let fields: Vec<(&str, i32)> = msg.field.iter().map(|f| (f.name(), f.number())).collect();
    assert_eq!(fields, [("code", 1), ("message", 2), ("details", 3)]);

    let details = file(&fds, "google/rpc/error_details.proto");
    let messages: BTreeSet<&str> = details
        .message_type
        .iter()
        .map(DescriptorProto::name)
        .collect();
    for m in [
        "ErrorInfo",
        "RetryInfo",
        "DebugInfo",
        "QuotaFailure",
        "PreconditionFailure",
        "BadRequest",
        "RequestInfo",
        "ResourceInfo",
        "Help",
        "LocalizedMessage",
    ] {
        assert!(messages.contains(m), "google.rpc.{m} missing");
    }
}

/// Walks a file's elements and records the `SourceCodeInfo` path and the
/// full name of every element that must carry a comment.
struct Walker {
    required: Vec<(Vec<i32>, String)>,
}

impl Walker {
    fn message(&mut self, path: &[i32], scope: &str, m: &DescriptorProto) {
        let name = format!("{scope}.{}", m.name());
        self.required
            .push((path.to_vec(), format!("message {name}")));

        // Oneofs synthesised for proto3 `optional` fields have no source.
        let synthetic: BTreeSet<i32> = m
            .field
            .iter()
            .filter(|f| f.proto3_optional())
            .filter_map(|f| f.oneof_index)
            .collect();

        for (i, f) in m.field.iter().enumerate() {
            let mut p = path.to_vec();
            p.extend([MESSAGE_FIELD, idx(i)]);
            self.required
                .push((p, format!("field {name}.{}", f.name())));
        }
        for (i, o) in m.oneof_decl.iter().enumerate() {
            if synthetic.contains(&idx(i)) {
                continue;
            }
            let mut p = path.to_vec();
            p.extend([MESSAGE_ONEOF_DECL, idx(i)]);
            self.required
                .push((p, format!("oneof {name}.{}", o.name())));
        }
        for (i, n) in m.nested_type.iter().enumerate() {
            // Map entries are synthesised from `map<K, V>` fields.
            if n.options.as_ref().is_some_and(|o| o.map_entry()) {
                continue;
            }
            let mut p = path.to_vec();
            p.extend([MESSAGE_NESTED_TYPE, idx(i)]);
            self.message(&p, &name, n);
        }
        for (i, e) in m.enum_type.iter().enumerate() {
            let mut p = path.to_vec();
            p.extend([MESSAGE_ENUM_TYPE, idx(i)]);
            self.enumeration(&p, &name, e);
        }
    }

    fn enumeration(&mut self, path: &[i32], scope: &str, e: &EnumDescriptorProto) {
        let name = format!("{scope}.{}", e.name());
        self.required.push((path.to_vec(), format!("enum {name}")));
        for (i, v) in e.value.iter().enumerate() {
            let mut p = path.to_vec();
            p.extend([ENUM_VALUE, idx(i)]);
            self.required
                .push((p, format!("enum value {name}.{}", v.name())));
        }
    }
}

#[test]
fn every_element_of_reconciled_v1_is_commented() {
    let fds = descriptor_set();
    let ours: Vec<&FileDescriptorProto> = fds
        .file
        .iter()
        .filter(|f| f.package() == "reconciled.v1")
        .collect();
    assert_eq!(ours.len(), 5, "reconciled.v1 files");

    let mut missing = Vec::new();
    let mut checked = 0;
    for f in ours {
        let info = f
            .source_code_info
            .as_ref()
            .unwrap_or_else(|| panic!("{} has source code info", f.name()));
        let commented: BTreeSet<&[i32]> = info
            .location
            .iter()
            .filter(|l| l.leading_comments().trim().len() > 1)
            .map(|l| l.path.as_slice())
            .collect();

        let scope = f.package();
        let mut w = Walker {
            required: Vec::new(),
        };
        for (i, m) in f.message_type.iter().enumerate() {
            w.message(&[FILE_MESSAGE_TYPE, idx(i)], scope, m);
        }
        for (i, e) in f.enum_type.iter().enumerate() {
            w.enumeration(&[FILE_ENUM_TYPE, idx(i)], scope, e);
        }
        for (i, s) in f.service.iter().enumerate() {
            let name = format!("{scope}.{}", s.name());
            w.required
                .push((vec![FILE_SERVICE, idx(i)], format!("service {name}")));
            for (j, m) in s.method.iter().enumerate() {
                w.required.push((
                    vec![FILE_SERVICE, idx(i), SERVICE_METHOD, idx(j)],
                    format!("rpc {name}.{}", m.name()),
                ));
            }
        }

        for (path, what) in w.required {
            checked += 1;
            if !commented.contains(path.as_slice()) {
                missing.push(format!("{what} ({})", f.name()));
            }
        }
    }
    assert!(checked > 300, "walked only {checked} elements");
    assert!(
        missing.is_empty(),
        "elements without a leading comment:\n  {}",
        missing.join("\n  ")
    );
}

#[test]
fn enums_start_with_a_prefixed_unspecified_value() {
    let fds = descriptor_set();
    for f in fds.file.iter().filter(|f| f.package() == "reconciled.v1") {
        for e in &f.enum_type {
            let prefix = screaming_snake(e.name());
            let first = e.value.first().expect("enum has values");
            assert_eq!(first.number(), 0, "{} starts at 0", e.name());
            assert_eq!(
                first.name(),
                format!("{prefix}_UNSPECIFIED"),
                "{}",
                e.name()
            );
            for v in &e.value {
                assert!(
                    v.name().starts_with(&format!("{prefix}_")),
                    "{}.{} is prefixed with {prefix}_",
                    e.name(),
                    v.name()
                );
            }
        }
    }
}

fn screaming_snake(camel: &str) -> String {
    let mut out = String::new();
    for (i, c) in camel.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_uppercase());
    }
    out
}

#[test]
fn generated_types_exist() {
    // Compile-time checks of the module paths other crates rely on.
    use reconciled_proto::google::rpc;
    use reconciled_proto::v1;

    let status = rpc::Status {
        code: 5,
        message: "gone".into(),
        details: Vec::new(),
    };
    let result = v1::OperationResult {
        op_id: "op".into(),
        attempt: 1,
        outcome: v1::Outcome::Failed.into(),
        status: Some(status.clone()),
        ..Default::default()
    };
    let bytes = result.encode_to_vec();
    let back = v1::OperationResult::decode(bytes.as_slice()).expect("round trip");
    assert_eq!(back.status, Some(status));
    assert_eq!(back.outcome(), v1::Outcome::Failed);

    let _ = v1::AgentMessage {
        message: Some(v1::agent_message::Message::Heartbeat(v1::Heartbeat {})),
    };
    let _ = v1::ExternalReport {
        change: Some(v1::external_report::Change::Delete(v1::ItemRef {
            r#type: "vlan".into(),
            name: "10".into(),
        })),
        modified: false,
    };
    let _ = rpc::BadRequest {
        field_violations: vec![rpc::bad_request::FieldViolation {
            field: "items[0].name".into(),
            ..Default::default()
        }],
    };
    let req = v1::SubmitIntentRequest {
        expected_generation: Some(3),
        ..Default::default()
    };
    assert_eq!(req.expected_generation, Some(3));
    assert_eq!(reconciled_proto::PROTOCOL_VERSION, 1);

    // Clients and servers are generated (no transport constructors).
    fn _paths(
        _: Option<v1::reconciler_client::ReconcilerClient<tonic::transport::Channel>>,
        _: Option<v1::configurators_client::ConfiguratorsClient<tonic::transport::Channel>>,
        _: Option<v1::tenants_client::TenantsClient<tonic::transport::Channel>>,
    ) {
    }
    let _ = v1::reconciler_server::SERVICE_NAME;
    let _ = v1::configurators_server::SERVICE_NAME;
    let _ = v1::tenants_server::SERVICE_NAME;
}
