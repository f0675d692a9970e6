//! `reconctl tenant create|list|get|delete|rotate-token` (admin token).

use serde_json::json;

use super::args::{OutputFormat, TenantCommand, TenantCreateArgs, TenantNameArgs, TenantTokenArgs};
use super::failure::{Exit, Failure};
use super::output::{emit, emit_as};
use super::{Session, fleet, json, status};
use crate::proto as v1;

/// Runs a `tenant` subcommand.
pub(crate) async fn run(session: &Session, command: TenantCommand) -> Result<Exit, Failure> {
    match command {
        TenantCommand::Create(args) => create(session, args).await,
        TenantCommand::List(args) => fleet::list(session, args.output).await,
        TenantCommand::Get(args) => get(session, args).await,
        TenantCommand::Delete(args) => delete(session, args).await,
        TenantCommand::RotateToken(args) => rotate_token(session, args).await,
    }
}

async fn create(session: &Session, args: TenantCreateArgs) -> Result<Exit, Failure> {
    let limits = v1::TenantLimits {
        max_items: args.max_items.unwrap_or(0),
        max_request_items: args.max_request_items.unwrap_or(0),
        max_agents: args.max_agents.unwrap_or(0),
        max_watchers: args.max_watchers.unwrap_or(0),
        max_operations_in_flight: args.max_operations_in_flight.unwrap_or(0),
    };
    let reply = session
        .client
        .create_tenant(v1::CreateTenantRequest {
            name: args.name.clone(),
            limits: (limits != v1::TenantLimits::default()).then_some(limits),
        })
        .await
        .map_err(|status| session.failed(&format!("create tenant {:?}", args.name), &status))?;
    print_token(&args.name, &reply.token, "created", args.quiet, args.output)?;
    Ok(Exit::Success)
}

/// Prints a token that the server shows only once.
fn print_token(
    name: &str,
    token: &str,
    what: &str,
    quiet: bool,
    format: OutputFormat,
) -> Result<(), Failure> {
    if quiet {
        return emit(&format!("{token}\n"));
    }
    emit_as(
        format,
        || json!({"name": name, "token": token}),
        || {
            format!(
                "tenant {name} {what}\ntoken: {token}\n(the token is shown only now; \
                 keep it, e.g. export RECONCILED_TOKEN=...)\n"
            )
        },
    )
}

async fn get(session: &Session, args: TenantNameArgs) -> Result<Exit, Failure> {
    let tenant = session
        .client
        .get_tenant(v1::GetTenantRequest {
            name: args.name.clone(),
        })
        .await
        .map_err(|status| session.failed(&format!("get tenant {:?}", args.name), &status))?;
    emit_as(args.output, || json::tenant(&tenant), || render(&tenant))?;
    Ok(Exit::Success)
}

/// A tenant as text: its creation time, limits and status.
fn render(tenant: &v1::Tenant) -> String {
    let limits = tenant.limits.unwrap_or_default();
    let limit = |value: u64| {
        if value == 0 {
            "server default".to_owned()
        } else {
            value.to_string()
        }
    };
    let created = tenant
        .created_at
        .as_ref()
        .map(ToString::to_string)
        .unwrap_or_default();
    format!(
        "name:        {}\ncreated:     {created}\nlimits:      max_items {}, max_request_items {}, \
         max_agents {}, max_watchers {}, max_operations_in_flight {}\n{}",
        tenant.name,
        limit(limits.max_items),
        limit(limits.max_request_items),
        limit(limits.max_agents),
        limit(limits.max_watchers),
        limit(limits.max_operations_in_flight),
        tenant
            .status
            .as_ref()
            .map(status::render)
            .unwrap_or_default(),
    )
}

async fn delete(session: &Session, args: TenantNameArgs) -> Result<Exit, Failure> {
    session
        .client
        .delete_tenant(v1::DeleteTenantRequest {
            name: args.name.clone(),
        })
        .await
        .map_err(|status| session.failed(&format!("delete tenant {:?}", args.name), &status))?;
    emit_as(
        args.output,
        || json!({"name": args.name, "deleted": true}),
        || format!("tenant {} deleted\n", args.name),
    )?;
    Ok(Exit::Success)
}

async fn rotate_token(session: &Session, args: TenantTokenArgs) -> Result<Exit, Failure> {
    let reply = session
        .client
        .rotate_token(v1::RotateTokenRequest {
            name: args.name.clone(),
        })
        .await
        .map_err(|status| {
            session.failed(
                &format!("rotate the token of tenant {:?}", args.name),
                &status,
            )
        })?;
    print_token(
        &args.name,
        &reply.token,
        "has a new token; the old one no longer works",
        args.quiet,
        args.output,
    )?;
    Ok(Exit::Success)
}
