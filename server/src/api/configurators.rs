//! The `reconciled.v1.Configurators` service: the agents' stream.

use std::pin::Pin;

use reconciled_proto::v1;
use reconciled_proto::v1::configurators_server::Configurators;
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};

use super::context::ApiContext;

/// The Configurators service.
#[derive(Clone)]
pub struct ConfiguratorsService {
    context: ApiContext,
}

impl ConfiguratorsService {
    /// A service over the shared API context.
    pub fn new(context: ApiContext) -> Self {
        Self { context }
    }
}

type ServerStream = Pin<Box<dyn Stream<Item = Result<v1::ServerMessage, Status>> + Send>>;

#[tonic::async_trait]
impl Configurators for ConfiguratorsService {
    type ConnectStream = ServerStream;

    async fn connect(
        &self,
        request: Request<Streaming<v1::AgentMessage>>,
    ) -> Result<Response<Self::ConnectStream>, Status> {
        let _caller = self.context.caller(request.metadata())?;
        Err(Status::unimplemented(
            "configurator sessions are not available in this build yet",
        ))
    }
}
