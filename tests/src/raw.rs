//! Raw calls: message bytes sent as they are, to put on the wire what no
//! well-behaved client would build in memory (dense, malformed or
//! oversized messages).

use prost::bytes::Bytes;
use tonic::Status;
use tonic::transport::Channel;

/// A codec that sends and receives message bytes as they are (sent as
/// [`Bytes`], so a payload sent again and again is not copied for each
/// call).
#[derive(Clone, Copy, Debug, Default)]
pub struct RawCodec;

/// The encoder and decoder of [`RawCodec`].
#[derive(Debug)]
pub struct RawBytes;

impl tonic::codec::Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Vec<u8>;
    type Encoder = RawBytes;
    type Decoder = RawBytes;

    fn encoder(&mut self) -> Self::Encoder {
        RawBytes
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawBytes
    }
}

impl tonic::codec::Encoder for RawBytes {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut tonic::codec::EncodeBuf<'_>) -> Result<(), Status> {
        use prost::bytes::BufMut as _;
        dst.put_slice(&item);
        Ok(())
    }
}

impl tonic::codec::Decoder for RawBytes {
    type Item = Vec<u8>;
    type Error = Status;

    fn decode(&mut self, src: &mut tonic::codec::DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
        use prost::bytes::Buf as _;
        let bytes = src.copy_to_bytes(src.remaining());
        Ok(Some(bytes.to_vec()))
    }
}

/// The SubmitIntent method's path.
pub const SUBMIT_INTENT: &str = "/reconciled.v1.Reconciler/SubmitIntent";

/// The ReportExternal method's path.
pub const REPORT_EXTERNAL: &str = "/reconciled.v1.Reconciler/ReportExternal";

/// The GetStatus method's path.
pub const GET_STATUS: &str = "/reconciled.v1.Reconciler/GetStatus";

/// The GetGraph method's path.
pub const GET_GRAPH: &str = "/reconciled.v1.Reconciler/GetGraph";

/// Sends `message` as it is to the unary method `path`, with `token` as
/// bearer (none if empty); the reply's bytes, or the status. A channel
/// that is not ready answers `UNAVAILABLE`.
pub async fn raw_unary(
    channel: &Channel,
    path: &'static str,
    token: &str,
    message: impl Into<Bytes>,
) -> Result<Vec<u8>, Status> {
    let mut grpc = tonic::client::Grpc::new(channel.clone())
        .max_encoding_message_size(64 * 1024 * 1024)
        .max_decoding_message_size(64 * 1024 * 1024);
    grpc.ready()
        .await
        .map_err(|error| Status::unavailable(error.to_string()))?;
    let mut request = tonic::Request::new(message.into());
    if !token.is_empty() {
        let value = format!("Bearer {token}")
            .parse()
            .map_err(|_| Status::invalid_argument("the token is not ASCII"))?;
        request.metadata_mut().insert("authorization", value);
    }
    grpc.unary::<Bytes, Vec<u8>, RawCodec>(
        request,
        tonic::codegen::http::uri::PathAndQuery::from_static(path),
        RawCodec,
    )
    .await
    .map(tonic::Response::into_inner)
}

/// A SubmitIntentRequest of `tenant` with `items` empty items, encoded by
/// hand: two bytes per item, each decoding into a whole `Item`.
pub fn empty_items_request(tenant: &str, items: usize) -> Vec<u8> {
    use prost::Message as _;
    let mut message = reconciled_proto::v1::SubmitIntentRequest {
        tenant: tenant.into(),
        ..Default::default()
    }
    .encode_to_vec();
    message.reserve(items * 2);
    for _ in 0..items {
        message.extend_from_slice(&[0x1a, 0x00]);
    }
    message
}
