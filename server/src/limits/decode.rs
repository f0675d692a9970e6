//! What decoding a message may cost, for every caller but the admin.
//!
//! Authentication runs before a body is read (`auth::AuthLayer`), so an
//! anonymous message is never decoded. For a tenant's (or a public health
//! or reflection) call, [`DecodeLimitLayer`] reads the gRPC frames of the
//! request body as they arrive, before tonic decodes them, and refuses:
//!
//! - a message longer than `max_tenant_message_bytes` (from its 5-byte
//!   frame header, before its body is buffered);
//! - a message that would decode into much more memory than it is long:
//!   protobuf encodes an empty item, list entry or map entry in two bytes,
//!   which decode into a struct of a few hundred bytes. The layer walks the
//!   message's wire format by its descriptor (no allocation, one pass) and
//!   estimates what decoding allocates; above
//!   `max(DECODED_BYTES_FLOOR, DECODED_BYTES_PER_BYTE × length)` the call is
//!   refused. Repeated-field counts are bounded that way, relative to the
//!   message's size.
//!
//! Both are refused `RESOURCE_EXHAUSTED` with a `QuotaFailure` on
//! `max_tenant_message_bytes`. Admin calls keep the services' own limit,
//! `max_message_bytes`.
//!
//! The same walk finds, for every caller, what prost would refuse (a value
//! cut short, a wrong wire type, a string that is not UTF-8, nesting deeper
//! than prost's 100 levels): tonic would answer those `INTERNAL`; they are
//! refused `INVALID_ARGUMENT` with the field path instead.

use std::collections::{HashMap, HashSet};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper::body::{Body as HttpBody, Bytes, Frame, SizeHint};
use prost::Message as _;
use prost_types::field_descriptor_proto::{Label, Type};
use tonic::body::Body;
use tonic::codegen::BoxFuture;
use tonic::codegen::http::{Request, Response};
use tower::{Layer, Service, ServiceExt as _};

use super::tenant_bytes::TenantBytes;
use crate::auth::Caller;
use crate::status::ApiError;
use crate::tenant::off_async_workers;

/// A message may decode into at most this many bytes per byte of its
/// length ...
pub const DECODED_BYTES_PER_BYTE: usize = 16;

/// ... or this many bytes, whichever is more (small messages of many small
/// values stay acceptable).
pub const DECODED_BYTES_FLOOR: usize = 64 * 1024 * 1024;

/// Messages longer than this are walked off the async workers.
const LARGE_WALK_BYTES: usize = 256 * 1024;

/// Deepest message nesting accepted: a little under prost's own recursion
/// limit (100), so that nothing prost would refuse for depth gets to it.
const MAX_DEPTH: usize = 96;

/// The memory a decoded value is charged for beyond its struct: a `String`
/// or `Vec` header, or the node share of a map entry.
const HEADER_BYTES: usize = 24;

/// Refuses over-long and over-dense messages of non-admin callers before
/// tonic decodes them (see the module documentation).
#[derive(Clone)]
pub struct DecodeLimitLayer {
    shared: Arc<Shared>,
}

struct Shared {
    max_message_bytes: usize,
    /// The setting that bounds `max_message_bytes`, named in refusals.
    setting: &'static str,
    schema: Schema,
    /// Request message type of each method path (`/pkg.Service/Method`).
    inputs: HashMap<String, String>,
    /// Paths of unary methods (the calls a tenant's byte budget covers).
    unary: HashSet<String>,
    /// Each tenant's budget of request bytes in unary calls, if limited.
    tenant_bytes: Option<TenantBytes>,
}

impl DecodeLimitLayer {
    /// A layer limiting non-admin messages to `max_tenant_message_bytes`.
    /// A refusal names the setting an operator would raise: that one, or
    /// `max_message_bytes` when it is the bound (the tenant limit cannot
    /// exceed it).
    pub fn new(max_tenant_message_bytes: usize, max_message_bytes: usize) -> Self {
        let setting = if max_tenant_message_bytes >= max_message_bytes {
            "max_message_bytes"
        } else {
            "max_tenant_message_bytes"
        };
        let set = prost_types::FileDescriptorSet::decode(reconciled_proto::FILE_DESCRIPTOR_SET)
            .unwrap_or_default();
        let mut inputs = HashMap::new();
        let mut unary = HashSet::new();
        for file in &set.file {
            for service in &file.service {
                for method in &service.method {
                    let path = format!("/{}.{}/{}", file.package(), service.name(), method.name());
                    if !method.client_streaming() && !method.server_streaming() {
                        unary.insert(path.clone());
                    }
                    inputs.insert(path, method.input_type().trim_start_matches('.').to_owned());
                }
            }
        }
        Self {
            shared: Arc::new(Shared {
                max_message_bytes: max_tenant_message_bytes,
                setting,
                schema: Schema::from_set(&set),
                inputs,
                unary,
                tenant_bytes: None,
            }),
        }
    }

    /// Also holds each tenant's unary request bytes to `rate` per second
    /// (see [`TenantBytes`]); `None`: no such limit.
    pub fn with_tenant_bytes_per_second(mut self, rate: Option<u64>) -> Self {
        if let Some(shared) = Arc::get_mut(&mut self.shared) {
            shared.tenant_bytes = rate.map(TenantBytes::new);
        }
        self
    }
}

impl<S> Layer<S> for DecodeLimitLayer {
    type Service = DecodeLimitService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        DecodeLimitService {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// The service of [`DecodeLimitLayer`].
#[derive(Clone)]
pub struct DecodeLimitService<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S> Service<Request<Body>> for DecodeLimitService<S>
where
    S: Service<Request<Body>, Response = Response<Body>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let admin = matches!(request.extensions().get::<Caller>(), Some(Caller::Admin));
        let message_type = self.shared.inputs.get(request.uri().path()).cloned();
        if admin && message_type.is_none() {
            return Box::pin(inner.oneshot(request));
        }
        let budget = match request.extensions().get::<Caller>() {
            Some(Caller::Tenant { tenant_id })
                if self.shared.tenant_bytes.is_some()
                    && self.shared.unary.contains(request.uri().path()) =>
            {
                Some(*tenant_id)
            }
            _ => None,
        };
        let shared = self.shared.clone();
        let request = request.map(|body| {
            Body::new(FrameCheck {
                inner: body,
                shared,
                message_type,
                admin,
                budget,
                buffered: Vec::new(),
                failed: false,
            })
        });
        Box::pin(inner.oneshot(request))
    }
}

/// A request body passed on one whole gRPC frame at a time, each checked.
struct FrameCheck {
    inner: Body,
    shared: Arc<Shared>,
    /// The method's request message type, when it is one of ours.
    message_type: Option<String>,
    /// The admin's call: only the well-formedness check applies (the
    /// services hold it to `max_message_bytes`).
    admin: bool,
    /// The tenant whose byte budget the message is charged to, until it is.
    budget: Option<u64>,
    /// Bytes of frames not complete yet.
    buffered: Vec<u8>,
    /// A frame was refused: the body ends.
    failed: bool,
}

/// Length of a gRPC frame header: compression flag and big-endian length.
const FRAME_HEADER: usize = 5;

impl FrameCheck {
    /// The complete frames at the front of `buffered`, checked; or why the
    /// first offending one is refused.
    fn take_complete_frames(&mut self) -> Result<Option<Bytes>, tonic::Status> {
        let mut end = 0;
        loop {
            let rest = &self.buffered[end..];
            let Some(header) = rest.get(..FRAME_HEADER) else {
                break;
            };
            let compressed = header[0] != 0;
            let length = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
            if !self.admin && length > self.shared.max_message_bytes {
                return Err(too_large(
                    length,
                    self.shared.max_message_bytes,
                    self.shared.setting,
                ));
            }
            if let (Some(tenant), Some(budget)) = (self.budget.take(), &self.shared.tenant_bytes) {
                budget
                    .charge(tenant, FRAME_HEADER + length)
                    .map_err(|wait| over_budget(budget.rate(), wait))?;
            }
            let Some(message) = rest.get(FRAME_HEADER..FRAME_HEADER + length) else {
                break;
            };
            if !compressed && let Some(message_type) = &self.message_type {
                let allowed = decoded_allowance(length);
                // The walk stops once a tenant's message is over its
                // allowance: refusing a dense message costs a fraction of
                // walking it all.
                let limit = if self.admin { usize::MAX } else { allowed };
                let schema = &self.shared.schema;
                let walk = || schema.decoded_bytes(message_type, message, limit);
                // A long walk leaves the async workers to everyone's calls.
                let estimate = if length > LARGE_WALK_BYTES {
                    off_async_workers(walk)
                } else {
                    walk()
                }
                .map_err(not_protobuf)?;
                if !self.admin && estimate > allowed {
                    return Err(too_dense(length, estimate, allowed));
                }
            }
            end += FRAME_HEADER + length;
        }
        if end == 0 {
            return Ok(None);
        }
        let rest = self.buffered.split_off(end);
        let complete = std::mem::replace(&mut self.buffered, rest);
        Ok(Some(Bytes::from(complete)))
    }
}

/// About how many bytes decoding `bytes` as the message `message_type`
/// (a full name such as `reconciled.v1.SubmitIntentRequest`) allocates, by
/// the compiled descriptor set: what [`DecodeLimitLayer`] compares with
/// [`decoded_allowance`]; or why prost would refuse the bytes.
pub fn estimate_decoded_bytes(message_type: &str, bytes: &[u8]) -> Result<usize, Malformed> {
    static SCHEMA: std::sync::OnceLock<Schema> = std::sync::OnceLock::new();
    SCHEMA
        .get_or_init(|| {
            let set = prost_types::FileDescriptorSet::decode(reconciled_proto::FILE_DESCRIPTOR_SET)
                .unwrap_or_default();
            Schema::from_set(&set)
        })
        .decoded_bytes(message_type, bytes, usize::MAX)
}

/// What a message of `length` bytes may decode into.
pub fn decoded_allowance(length: usize) -> usize {
    DECODED_BYTES_FLOOR.max(length.saturating_mul(DECODED_BYTES_PER_BYTE))
}

fn not_protobuf(malformed: Malformed) -> tonic::Status {
    let field = if malformed.path.is_empty() {
        String::from("(message)")
    } else {
        malformed.path
    };
    ApiError::invalid_field(
        field,
        format!(
            "the request is not a valid protobuf message of its type: {}; fix the client's encoding",
            malformed.reason
        ),
    )
    .into()
}

fn too_large(length: usize, limit: usize, setting: &str) -> tonic::Status {
    ApiError::QuotaExceeded {
        subject: setting.into(),
        description: format!(
            "the request message is {length} bytes; tenant calls may send at most {limit} bytes \
             ({setting}; admin calls up to max_message_bytes); split it, e.g. into subgraphs"
        ),
    }
    .into()
}

fn over_budget(rate: u64, wait: std::time::Duration) -> tonic::Status {
    ApiError::Overloaded {
        message: format!(
            "this tenant has sent more request bytes than its budget of {rate} bytes per second \
             (max_tenant_bytes_per_second); retry after the delay in RetryInfo, or send less"
        ),
        retry_after: wait,
    }
    .into()
}

fn too_dense(length: usize, estimate: usize, allowed: usize) -> tonic::Status {
    ApiError::QuotaExceeded {
        subject: "max_tenant_message_bytes".into(),
        description: format!(
            "the request message is {length} bytes but would decode into about {} MiB, more than \
             the {} MiB a tenant message of this size may (at least {} MiB, or {DECODED_BYTES_PER_BYTE} \
             times its size; the size is capped by max_tenant_message_bytes): it holds too many \
             empty or tiny values; send fewer of them or split the request",
            estimate / (1024 * 1024),
            allowed / (1024 * 1024),
            DECODED_BYTES_FLOOR / (1024 * 1024)
        ),
    }
    .into()
}

impl HttpBody for FrameCheck {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        loop {
            if this.failed {
                return Poll::Ready(None);
            }
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => {
                    // An incomplete frame at the end: tonic reports it.
                    if this.buffered.is_empty() {
                        return Poll::Ready(None);
                    }
                    let rest = std::mem::take(&mut this.buffered);
                    return Poll::Ready(Some(Ok(Frame::data(Bytes::from(rest)))));
                }
                Poll::Ready(Some(Err(error))) => return Poll::Ready(Some(Err(error))),
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => {
                        this.buffered.extend_from_slice(&data);
                        match this.take_complete_frames() {
                            Ok(Some(complete)) => {
                                return Poll::Ready(Some(Ok(Frame::data(complete))));
                            }
                            Ok(None) => continue,
                            Err(refused) => {
                                this.failed = true;
                                this.buffered = Vec::new();
                                return Poll::Ready(Some(Err(refused)));
                            }
                        }
                    }
                    // Trailers pass as they are.
                    Err(frame) => return Poll::Ready(Some(Ok(frame))),
                },
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.failed || (self.inner.is_end_stream() && self.buffered.is_empty())
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

/// What the walk needs of each message type.
#[derive(Debug, Default)]
struct MessageShape {
    /// Approximate size of its decoded struct, nested singular messages
    /// included (prost keeps them inline).
    weight: usize,
    /// A type the descriptor set names but does not describe: its bytes
    /// are not walked.
    opaque: bool,
    /// Its fields, sorted by number (a message has a handful: a search
    /// of this list is cheaper than hashing the number).
    fields: Vec<(u32, FieldShape)>,
}

impl MessageShape {
    /// The field numbered `number`, if the type has one.
    fn field(&self, number: u64) -> Option<&FieldShape> {
        let number = u32::try_from(number).ok()?;
        self.fields
            .binary_search_by_key(&number, |(n, _)| *n)
            .ok()
            .map(|index| &self.fields[index].1)
    }
}

#[derive(Clone, Debug)]
struct FieldShape {
    /// The field's name, for the path of a malformed value.
    name: String,
    repeated: bool,
    /// The field's message type (its index in [`Schema::messages`]), for
    /// message fields.
    message: Option<usize>,
    /// A string field: its bytes must be UTF-8.
    string: bool,
    /// A string or bytes field.
    bytes: bool,
    /// The wire type of one scalar value (0 varint, 1 fixed64, 5 fixed32);
    /// 2 for strings, bytes and messages.
    wire_type: u64,
}

/// Why a message is not valid protobuf for its type: what prost would
/// refuse (tonic then answers INTERNAL), found before it runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Malformed {
    /// Where: field names from the message down, e.g. `items.name`.
    pub path: String,
    /// What is wrong.
    pub reason: &'static str,
}

/// Deepest path shown in a [`Malformed`].
const PATH_SHOWN: usize = 8;

fn malformed(path: &[&str], reason: &'static str) -> Malformed {
    let mut shown: Vec<&str> = path.iter().take(PATH_SHOWN).copied().collect();
    if path.len() > PATH_SHOWN {
        shown.push("…");
    }
    Malformed {
        path: shown.join("."),
        reason,
    }
}

/// Message shapes, from a descriptor set. The walk follows fields to
/// their types by index: it hashes nothing per field or per message.
#[derive(Debug, Default)]
struct Schema {
    messages: Vec<MessageShape>,
    /// Indexes into `messages` by full name, for where a walk starts.
    by_name: HashMap<String, usize>,
}

impl Schema {
    fn from_set(set: &prost_types::FileDescriptorSet) -> Self {
        let mut descriptors = HashMap::new();
        for file in &set.file {
            for message in &file.message_type {
                collect(file.package(), message, &mut descriptors);
            }
        }
        // Every message type, described or only named by a field, gets
        // its index first, so that fields can point at their types.
        let mut names: Vec<String> = descriptors.keys().cloned().collect();
        for descriptor in descriptors.values() {
            for field in &descriptor.field {
                let name = field.type_name().trim_start_matches('.');
                if field.r#type() == Type::Message && !descriptors.contains_key(name) {
                    names.push(name.to_owned());
                }
            }
        }
        names.sort();
        names.dedup();
        let by_name: HashMap<String, usize> = names
            .iter()
            .enumerate()
            .map(|(index, name)| (name.clone(), index))
            .collect();
        let mut messages = Vec::with_capacity(names.len());
        for name in &names {
            let Some(descriptor) = descriptors.get(name) else {
                messages.push(MessageShape {
                    opaque: true,
                    ..MessageShape::default()
                });
                continue;
            };
            let mut fields: Vec<(u32, FieldShape)> = descriptor
                .field
                .iter()
                .map(|field| {
                    let message = (field.r#type() == Type::Message)
                        .then(|| {
                            by_name
                                .get(field.type_name().trim_start_matches('.'))
                                .copied()
                        })
                        .flatten();
                    let wire_type = match field.r#type() {
                        Type::Double | Type::Fixed64 | Type::Sfixed64 => 1,
                        Type::Float | Type::Fixed32 | Type::Sfixed32 => 5,
                        Type::String | Type::Bytes | Type::Message | Type::Group => 2,
                        _ => 0,
                    };
                    let shape = FieldShape {
                        name: field.name().to_owned(),
                        repeated: field.label() == Label::Repeated,
                        message,
                        string: field.r#type() == Type::String,
                        bytes: matches!(field.r#type(), Type::String | Type::Bytes),
                        wire_type,
                    };
                    (u32::try_from(field.number()).unwrap_or(0), shape)
                })
                .collect();
            fields.sort_by_key(|(number, _)| *number);
            let weight = weight_of(name, &descriptors, &mut Vec::new());
            messages.push(MessageShape {
                weight,
                opaque: false,
                fields,
            });
        }
        Schema { messages, by_name }
    }

    /// What decoding `bytes` as a `message_type` allocates, about (once
    /// over `limit`, the walk stops and the estimate so far is returned); or
    /// why prost would refuse the bytes.
    fn decoded_bytes(
        &self,
        message_type: &str,
        bytes: &[u8],
        limit: usize,
    ) -> Result<usize, Malformed> {
        let Some(&index) = self.by_name.get(message_type) else {
            return Ok(0);
        };
        let mut walk = Walk {
            spent: self.messages[index].weight,
            limit,
        };
        let mut path = Vec::new();
        match self.walk(index, bytes, &mut path, &mut walk) {
            Ok(()) | Err(Stop::OverLimit) => Ok(walk.spent),
            Err(Stop::Malformed(malformed)) => Err(malformed),
        }
    }

    /// Charges the allocations of the fields in `bytes` to `walk` (the
    /// message's own struct is its parent's business), or finds why the
    /// bytes are not a valid message of the type at `message` in
    /// [`Self::messages`]. `path` holds the field names down to here.
    fn walk<'a>(
        &'a self,
        message: usize,
        bytes: &[u8],
        path: &mut Vec<&'a str>,
        walk: &mut Walk,
    ) -> Result<(), Stop> {
        let shape = &self.messages[message];
        if shape.opaque {
            return Ok(());
        }
        if path.len() >= MAX_DEPTH {
            return Err(malformed(path, "messages nested more than 96 levels deep").into());
        }
        let mut rest = bytes;
        while !rest.is_empty() {
            let Some((tag, after)) = varint(rest) else {
                return Err(malformed(path, "a field tag is cut short").into());
            };
            rest = after;
            let number = tag >> 3;
            if number == 0 || number > u64::from(u32::MAX >> 3) {
                return Err(malformed(path, "a field number is out of range").into());
            }
            let field = shape.field(number);
            let wire_type = tag & 7;
            if let Some(field) = field {
                let packed = field.repeated && field.wire_type != 2 && wire_type == 2;
                if wire_type != field.wire_type && !packed {
                    path.push(&field.name);
                    let error = malformed(path, "a value has the wrong wire type for its field");
                    path.pop();
                    return Err(error.into());
                }
            }
            match wire_type {
                0 => {
                    let Some((_, after)) = varint(rest) else {
                        return Err(malformed(path, "a number is cut short").into());
                    };
                    rest = after;
                    if field.is_some_and(|f| f.repeated) {
                        walk.charge(8)?;
                    }
                }
                1 | 5 => {
                    let width = if wire_type == 1 { 8 } else { 4 };
                    let Some(after) = rest.get(width..) else {
                        return Err(malformed(path, "a fixed-width number is cut short").into());
                    };
                    rest = after;
                    if field.is_some_and(|f| f.repeated) {
                        walk.charge(8)?;
                    }
                }
                2 => {
                    let Some((length, after)) = varint(rest) else {
                        return Err(malformed(path, "a length is cut short").into());
                    };
                    let Some(value) = usize::try_from(length).ok().and_then(|l| after.get(..l))
                    else {
                        return Err(
                            malformed(path, "a value runs past the end of the message").into()
                        );
                    };
                    rest = &after[value.len()..];
                    let Some(field) = field else { continue };
                    path.push(&field.name);
                    let charged = match (&field.message, field.bytes) {
                        (Some(child), _) => {
                            let own = if field.repeated {
                                self.messages[*child].weight + HEADER_BYTES
                            } else {
                                0
                            };
                            walk.charge(own)
                                .and_then(|()| self.walk(*child, value, path, walk))
                        }
                        (None, true) => {
                            if field.string && std::str::from_utf8(value).is_err() {
                                Err(malformed(path, "a string is not valid UTF-8").into())
                            } else {
                                walk.charge(value.len() + HEADER_BYTES)
                            }
                        }
                        // Packed scalars: at most 8 bytes each, one byte
                        // each at least on the wire.
                        (None, false) => walk.charge(value.len().saturating_mul(8)),
                    };
                    path.pop();
                    charged?;
                }
                _ => return Err(malformed(path, "a field has an unknown wire type").into()),
            }
        }
        Ok(())
    }
}

/// The running estimate of one walk.
struct Walk {
    spent: usize,
    limit: usize,
}

impl Walk {
    fn charge(&mut self, bytes: usize) -> Result<(), Stop> {
        self.spent = self.spent.saturating_add(bytes);
        if self.spent > self.limit {
            Err(Stop::OverLimit)
        } else {
            Ok(())
        }
    }
}

/// Why a walk stopped early.
enum Stop {
    /// The bytes are not a valid message.
    Malformed(Malformed),
    /// The estimate passed the limit: the rest need not be walked.
    OverLimit,
}

impl From<Malformed> for Stop {
    fn from(malformed: Malformed) -> Self {
        Self::Malformed(malformed)
    }
}

fn collect(
    scope: &str,
    message: &prost_types::DescriptorProto,
    into: &mut HashMap<String, prost_types::DescriptorProto>,
) {
    let name = if scope.is_empty() {
        message.name().to_owned()
    } else {
        format!("{scope}.{}", message.name())
    };
    for nested in &message.nested_type {
        collect(&name, nested, into);
    }
    into.insert(name, message.clone());
}

/// About `size_of` the struct prost generates for `name`: 8 bytes per
/// scalar, a header per string, bytes or repeated field, and singular
/// message fields inline (boxed, 8 bytes, when they recurse).
fn weight_of(
    name: &str,
    descriptors: &HashMap<String, prost_types::DescriptorProto>,
    path: &mut Vec<String>,
) -> usize {
    let Some(descriptor) = descriptors.get(name) else {
        return HEADER_BYTES;
    };
    if path.iter().any(|seen| seen == name) || path.len() > MAX_DEPTH {
        return 8;
    }
    path.push(name.to_owned());
    let mut weight = 8;
    for field in &descriptor.field {
        weight += if field.label() == Label::Repeated {
            HEADER_BYTES
        } else {
            match field.r#type() {
                Type::String | Type::Bytes => HEADER_BYTES,
                Type::Message => {
                    8 + weight_of(field.type_name().trim_start_matches('.'), descriptors, path)
                }
                _ => 8,
            }
        };
    }
    path.pop();
    weight
}

/// A protobuf varint at the front of `bytes`, and what follows it.
fn varint(bytes: &[u8]) -> Option<(u64, &[u8])> {
    let mut value: u64 = 0;
    for (index, byte) in bytes.iter().enumerate().take(10) {
        value |= u64::from(byte & 0x7f) << (7 * index);
        if byte & 0x80 == 0 {
            return Some((value, &bytes[index + 1..]));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use reconciled_proto::v1;

    use super::*;

    fn schema() -> Schema {
        let set = prost_types::FileDescriptorSet::decode(reconciled_proto::FILE_DESCRIPTOR_SET)
            .expect("the compiled descriptor set decodes");
        Schema::from_set(&set)
    }

    fn submit(items: Vec<v1::Item>) -> Vec<u8> {
        v1::SubmitIntentRequest {
            tenant: "acme".into(),
            items,
            ..Default::default()
        }
        .encode_to_vec()
    }

    #[test]
    fn empty_items_are_dense_and_refused_while_real_ones_are_not() {
        let schema = schema();
        // 2M empty items: 4 MB on the wire (8M took 1.5 GB to decode).
        let mut dense = submit(Vec::new());
        for _ in 0..2_000_000 {
            dense.extend_from_slice(&[0x1a, 0x00]);
        }
        let estimate = schema
            .decoded_bytes("reconciled.v1.SubmitIntentRequest", &dense, usize::MAX)
            .expect("well formed");
        assert!(
            estimate > decoded_allowance(dense.len()),
            "{estimate} bytes estimated for {}",
            dense.len()
        );
        assert!(estimate / dense.len() > 50, "{}", estimate / dense.len());
        // With the allowance as limit the walk stops soon after passing it.
        let allowed = decoded_allowance(dense.len());
        let stopped = schema
            .decoded_bytes("reconciled.v1.SubmitIntentRequest", &dense, allowed)
            .expect("well formed");
        assert!(stopped > allowed && stopped < estimate, "{stopped}");

        // 10,000 ordinary items with a few properties pass with room.
        let items = (0..10_000)
            .map(|index| {
                let mut properties = prost_types::Struct::default();
                for key in ["mtu", "state", "owner"] {
                    properties.fields.insert(
                        key.into(),
                        prost_types::Value {
                            kind: Some(prost_types::value::Kind::StringValue(format!("{index}"))),
                        },
                    );
                }
                v1::Item {
                    r#type: "interface".into(),
                    name: format!("eth{index}"),
                    properties: Some(properties),
                    ..Default::default()
                }
            })
            .collect();
        let real = submit(items);
        let estimate = schema
            .decoded_bytes("reconciled.v1.SubmitIntentRequest", &real, usize::MAX)
            .expect("well formed");
        assert!(estimate < decoded_allowance(real.len()), "{estimate}");
        assert!(
            estimate / real.len() < DECODED_BYTES_PER_BYTE,
            "{} per byte",
            estimate / real.len()
        );
    }

    #[test]
    fn a_deep_list_of_nulls_is_charged_for_every_entry() {
        let schema = schema();
        let list = prost_types::ListValue {
            values: vec![prost_types::Value::default(); 100_000],
        };
        let mut properties = prost_types::Struct::default();
        properties.fields.insert(
            "l".into(),
            prost_types::Value {
                kind: Some(prost_types::value::Kind::ListValue(list)),
            },
        );
        let bytes = submit(vec![v1::Item {
            r#type: "t".into(),
            name: "n".into(),
            properties: Some(properties),
            ..Default::default()
        }]);
        let estimate = schema
            .decoded_bytes("reconciled.v1.SubmitIntentRequest", &bytes, usize::MAX)
            .expect("well formed");
        assert!(
            estimate >= 100_000 * 32,
            "{estimate} bytes for {} on the wire",
            bytes.len()
        );
    }

    #[test]
    fn what_prost_refuses_is_found_with_its_path() {
        let schema = schema();
        let refused = |bytes: &[u8]| {
            assert!(
                v1::SubmitIntentRequest::decode(bytes).is_err(),
                "prost refuses {bytes:?}"
            );
            schema
                .decoded_bytes("reconciled.v1.SubmitIntentRequest", bytes, usize::MAX)
                .expect_err("the walk refuses it too")
        };
        refused(&[0xff_u8; 12]);
        refused(&[0x12, 0xff, 0xff, 0xff, 0xff, 0x0f]);
        refused(&[0x0b]);
        // items[0].name = [0xff]: not UTF-8.
        let bad_name = refused(&[0x1a, 0x03, 0x12, 0x01, 0xff]);
        assert_eq!(bad_name.path, "items.name");
        assert!(bad_name.reason.contains("UTF-8"));
        // A string field sent as a number.
        let wrong = refused(&[0x08, 0x01]);
        assert_eq!(wrong.path, "tenant");
        // 200 nested lists in an item's properties.
        let mut value = prost_types::Value::default();
        for _ in 0..200 {
            value = prost_types::Value {
                kind: Some(prost_types::value::Kind::ListValue(
                    prost_types::ListValue {
                        values: vec![value],
                    },
                )),
            };
        }
        let mut properties = prost_types::Struct::default();
        properties.fields.insert("deep".into(), value);
        let deep = submit(vec![v1::Item {
            r#type: "t".into(),
            name: "n".into(),
            properties: Some(properties),
            ..Default::default()
        }]);
        let too_deep = refused(&deep);
        assert!(too_deep.reason.contains("nested"), "{too_deep:?}");
        assert!(
            too_deep.path.starts_with("items.properties.fields"),
            "{too_deep:?}"
        );
    }
}
