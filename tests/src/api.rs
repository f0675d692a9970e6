//! A small authorised gRPC client for tests, item builders, and helpers
//! that read `google.rpc` error details from a status.

use reconciled_proto::v1;
use reconciled_proto::v1::reconciler_client::ReconcilerClient;
use reconciled_proto::v1::tenants_client::TenantsClient;
use tonic::metadata::MetadataValue;
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic::{Request, Status};
use tonic_types::StatusExt as _;

/// Adds `authorization: Bearer <token>` to every request.
#[derive(Clone)]
pub struct Bearer(Option<MetadataValue<tonic::metadata::Ascii>>);

impl Bearer {
    /// A bearer interceptor for `token`; an empty token sends no header.
    pub fn new(token: &str) -> Self {
        if token.is_empty() {
            return Self(None);
        }
        Self(MetadataValue::try_from(format!("Bearer {token}")).ok())
    }
}

impl Interceptor for Bearer {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}

/// Reconciler client with a token.
pub type Reconciler = ReconcilerClient<InterceptedService<Channel, Bearer>>;
/// Tenants client with a token.
pub type Tenants = TenantsClient<InterceptedService<Channel, Bearer>>;

/// A Reconciler client that sends `token`.
pub fn reconciler(channel: &Channel, token: &str) -> Reconciler {
    ReconcilerClient::with_interceptor(channel.clone(), Bearer::new(token))
        .max_decoding_message_size(64 * 1024 * 1024)
        .max_encoding_message_size(64 * 1024 * 1024)
}

/// A Tenants client that sends `token`.
pub fn tenants(channel: &Channel, token: &str) -> Tenants {
    TenantsClient::with_interceptor(channel.clone(), Bearer::new(token))
}

/// Creates a tenant with the admin token; returns the tenant's token.
pub async fn create_tenant(channel: &Channel, admin_token: &str, name: &str) -> String {
    tenants(channel, admin_token)
        .create_tenant(v1::CreateTenantRequest {
            name: name.into(),
            limits: None,
        })
        .await
        .unwrap_or_else(|status| panic!("CreateTenant {name} failed: {status:?}"))
        .into_inner()
        .token
}

/// Rotates tenant `name`'s token with the admin token; returns the new one.
///
/// # Panics
/// If the server refuses it.
pub async fn rotate_token(channel: &Channel, admin_token: &str, name: &str) -> String {
    tenants(channel, admin_token)
        .rotate_token(v1::RotateTokenRequest { name: name.into() })
        .await
        .unwrap_or_else(|status| panic!("RotateToken {name} failed: {status:?}"))
        .into_inner()
        .token
}

/// `tenant`'s status, read with `token` (panics if GetStatus fails).
pub async fn status_of(channel: &Channel, token: &str, tenant: &str) -> v1::TenantStatus {
    reconciler(channel, token)
        .get_status(v1::GetStatusRequest {
            tenant: tenant.into(),
        })
        .await
        .expect("status")
        .into_inner()
        .status
        .expect("status body")
}

/// The revision `tenant` is at, read with `token` (panics if GetStatus fails).
pub async fn revision_of(channel: &Channel, token: &str, tenant: &str) -> u64 {
    status_of(channel, token, tenant).await.revision
}

/// An item `item_type/name` with properties given as JSON.
pub fn item(item_type: &str, name: &str, properties: serde_json::Value) -> v1::Item {
    v1::Item {
        r#type: item_type.into(),
        name: name.into(),
        properties: Some(json_to_struct(properties)),
        ..v1::Item::default()
    }
}

/// A dependency on `item_type/name`.
pub fn dependency(item_type: &str, name: &str) -> v1::Dependency {
    v1::Dependency {
        requires: Some(v1::ItemRef {
            r#type: item_type.into(),
            name: name.into(),
        }),
        ..v1::Dependency::default()
    }
}

/// A SubmitIntent of the whole graph.
pub fn submit(tenant: &str, items: Vec<v1::Item>) -> v1::SubmitIntentRequest {
    v1::SubmitIntentRequest {
        tenant: tenant.into(),
        items,
        ..v1::SubmitIntentRequest::default()
    }
}

/// Converts JSON to a protobuf Struct (objects only; other values give {}).
pub fn json_to_struct(value: serde_json::Value) -> prost_types::Struct {
    match value {
        serde_json::Value::Object(map) => reconciled_proto::json::properties_to_struct(&map),
        _ => prost_types::Struct::default(),
    }
}

/// The `BadRequest` field paths of an error status.
pub fn violated_fields(status: &Status) -> Vec<String> {
    status
        .get_error_details()
        .bad_request()
        .map(|bad| {
            bad.field_violations
                .iter()
                .map(|v| v.field.clone())
                .collect()
        })
        .unwrap_or_default()
}

/// The `ErrorInfo` reason of an error status.
pub fn error_reason(status: &Status) -> Option<String> {
    status
        .get_error_details()
        .error_info()
        .map(|info| info.reason.clone())
}

/// An `ErrorInfo` metadata value of an error status.
pub fn error_metadata(status: &Status, key: &str) -> Option<String> {
    status
        .get_error_details()
        .error_info()
        .and_then(|info| info.metadata.get(key).cloned())
}
