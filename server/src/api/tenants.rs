//! The `reconciled.v1.Tenants` admin service.

use reconciled_proto::v1;
use reconciled_proto::v1::tenants_server::Tenants;
use tonic::{Request, Response, Status};
use tracing::instrument;

use crate::graph::validate::validate_name;
use crate::status::ApiError;
use crate::tenant::TenantLimits;

use super::context::{ApiContext, invalid};
use super::paging::{decode_text, encode_text};
use super::views::quarantined_to_proto;

/// Tenants per ListTenants page when the request names no size, and the most.
const DEFAULT_PAGE_SIZE: usize = 100;
const MAX_PAGE_SIZE: usize = 1_000;

/// The Tenants service.
#[derive(Clone)]
pub struct TenantsService {
    context: ApiContext,
}

impl TenantsService {
    /// A service over the shared API context.
    pub fn new(context: ApiContext) -> Self {
        Self { context }
    }
}

use super::watch::FleetStream;

#[tonic::async_trait]
impl Tenants for TenantsService {
    #[instrument(skip_all, fields(tenant = %request.get_ref().name))]
    async fn create_tenant(
        &self,
        request: Request<v1::CreateTenantRequest>,
    ) -> Result<Response<v1::CreateTenantResponse>, Status> {
        let caller = self.context.caller(request.metadata())?;
        self.context.require_admin(caller)?;
        let request = request.into_inner();
        validate_name(&request.name, &self.context.limits)
            .map_err(|problem| invalid("name", format!("the tenant name {problem}")))?;
        if let Some(cluster) = &self.context.cluster {
            let (tenant, token) = cluster
                .create_tenant(&request.name, TenantLimits::from_proto(request.limits))
                .await?;
            return Ok(Response::new(v1::CreateTenantResponse {
                tenant: Some(tenant),
                token,
            }));
        }
        let (handle, token) = self
            .context
            .directory
            .create(&request.name, TenantLimits::from_proto(request.limits))
            .await
            .map_err(ApiError::from)?;
        Ok(Response::new(v1::CreateTenantResponse {
            tenant: Some(self.context.tenant_of(&handle.snapshots.latest())),
            token,
        }))
    }

    #[instrument(skip_all, fields(tenant = %request.get_ref().name))]
    async fn get_tenant(
        &self,
        request: Request<v1::GetTenantRequest>,
    ) -> Result<Response<v1::Tenant>, Status> {
        let caller = self.context.caller(request.metadata())?;
        let handle = self.context.tenant(caller, &request.get_ref().name)?;
        Ok(Response::new(
            self.context.tenant_of(&handle.snapshots.latest()),
        ))
    }

    async fn list_tenants(
        &self,
        request: Request<v1::ListTenantsRequest>,
    ) -> Result<Response<v1::ListTenantsResponse>, Status> {
        let caller = self.context.caller(request.metadata())?;
        self.context.require_admin(caller)?;
        let request_metadata = request.metadata().clone();
        let request = request.into_inner();
        let after = if request.page_token.is_empty() {
            None
        } else {
            Some(decode_text(&request.page_token).ok_or_else(|| {
                invalid(
                    "page_token",
                    "not a page token from ListTenants; omit it to start over",
                )
            })?)
        };
        let page_size = match request.page_size {
            0 => DEFAULT_PAGE_SIZE,
            size => (size as usize).min(MAX_PAGE_SIZE),
        };
        if let Some(cluster) = &self.context.cluster {
            let (tenants, next_page_token) = super::fleet_list::list(
                &self.context,
                cluster,
                request_metadata,
                after.as_deref(),
                page_size,
            )
            .await;
            return Ok(Response::new(v1::ListTenantsResponse {
                tenants,
                next_page_token,
            }));
        }
        // Served and quarantined tenants, merged in name order.
        let directory = &self.context.directory;
        let served = directory
            .list(after.as_deref(), page_size + 1)
            .into_iter()
            .map(|handle| {
                (
                    handle.name.clone(),
                    self.context.tenant_of(&handle.snapshots.latest()),
                )
            });
        let quarantined = directory
            .list_quarantined(after.as_deref(), page_size + 1)
            .into_iter()
            .map(|(name, quarantined)| (name.clone(), quarantined_to_proto(name, &quarantined)));
        let mut tenants: Vec<(String, v1::Tenant)> = served.chain(quarantined).collect();
        tenants.sort_by(|a, b| a.0.cmp(&b.0));
        let more = tenants.len() > page_size;
        tenants.truncate(page_size);
        let next_page_token = match (more, tenants.last()) {
            (true, Some((last, _))) => encode_text(last),
            _ => String::new(),
        };
        Ok(Response::new(v1::ListTenantsResponse {
            tenants: tenants.into_iter().map(|(_, tenant)| tenant).collect(),
            next_page_token,
        }))
    }

    #[instrument(skip_all, fields(tenant = %request.get_ref().name))]
    async fn delete_tenant(
        &self,
        request: Request<v1::DeleteTenantRequest>,
    ) -> Result<Response<v1::DeleteTenantResponse>, Status> {
        let caller = self.context.caller(request.metadata())?;
        self.context.require_admin(caller)?;
        self.context
            .directory
            .delete(&request.get_ref().name)
            .await
            .map_err(|error| self.context.admin_failed(&request.get_ref().name, error))?;
        Ok(Response::new(v1::DeleteTenantResponse {}))
    }

    #[instrument(skip_all, fields(tenant = %request.get_ref().name))]
    async fn rotate_token(
        &self,
        request: Request<v1::RotateTokenRequest>,
    ) -> Result<Response<v1::RotateTokenResponse>, Status> {
        let caller = self.context.caller(request.metadata())?;
        self.context.require_admin(caller)?;
        let token = self
            .context
            .directory
            .rotate_token(&request.get_ref().name)
            .await
            .map_err(|error| self.context.admin_failed(&request.get_ref().name, error))?;
        Ok(Response::new(v1::RotateTokenResponse { token }))
    }

    type WatchFleetStream = FleetStream;

    async fn watch_fleet(
        &self,
        request: Request<v1::WatchFleetRequest>,
    ) -> Result<Response<Self::WatchFleetStream>, Status> {
        let caller = self.context.caller(request.metadata())?;
        self.context.require_admin(caller)?;
        if let Some(cluster) = &self.context.cluster {
            let fleet = cluster.fleet();
            let stream = super::watch::watch_fleet_of(
                &fleet.hub,
                fleet.clone(),
                || fleet.snapshot(),
                request.get_ref(),
                self.context.watch,
            )?;
            return Ok(Response::new(stream));
        }
        let stream =
            super::watch::watch_fleet(&self.context.fleet, request.get_ref(), self.context.watch)?;
        Ok(Response::new(stream))
    }
}
