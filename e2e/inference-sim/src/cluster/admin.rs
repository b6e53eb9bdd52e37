//! The admin endpoint: kill, restart and fault control of single pods from
//! outside the process (routes in the parent module's docs).

use std::convert::Infallible;
use std::future::Future;

use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::task::JoinSet;

use super::{Cluster, ClusterError};
use crate::faults::Faults;
use crate::http::{json_response, read_json, Body};
use crate::openai::ApiError;

/// Serves the admin API on `listener` until `shutdown` resolves.
pub async fn serve_admin(
    listener: TcpListener,
    cluster: Cluster,
    shutdown: impl Future<Output = ()>,
) {
    let builder = auto::Builder::new(TokioExecutor::new());
    let mut conns = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let cluster = cluster.clone();
                let builder = builder.clone();
                conns.spawn(async move {
                    let svc = service_fn(move |req| handle(cluster.clone(), req));
                    let _ = builder.serve_connection(TokioIo::new(stream), svc).await;
                });
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            () = &mut shutdown => return,
        }
    }
}

async fn handle(cluster: Cluster, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let resp = match route(&cluster, req).await {
        Ok(resp) => resp,
        Err(AdminError::Cluster(e)) => {
            let status = match e {
                ClusterError::NoSuchPod(_) => StatusCode::NOT_FOUND,
                _ => StatusCode::INTERNAL_SERVER_ERROR,
            };
            json_response(status, &json!({"error": e.to_string()}))
        }
        Err(AdminError::Api(e)) => json_response(e.status(), &e.body()),
    };
    Ok(resp)
}

#[derive(Debug, thiserror::Error)]
enum AdminError {
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    #[error(transparent)]
    Api(#[from] ApiError),
}

async fn route(cluster: &Cluster, req: Request<Incoming>) -> Result<Response<Body>, AdminError> {
    let path: Vec<String> = req
        .uri()
        .path()
        .split('/')
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    let parts: Vec<&str> = path.iter().map(String::as_str).collect();
    let ok = || json_response(StatusCode::OK, &json!({"ok": true}));
    match (req.method().clone(), parts.as_slice()) {
        (Method::GET, ["admin", "pods"]) => Ok(json_response(
            StatusCode::OK,
            &json!(cluster.status().await),
        )),
        (method, ["admin", "pods", index, action]) => {
            let i: usize = index
                .parse()
                .map_err(|_| ApiError::BadRequest(format!("bad pod index {index:?}")))?;
            match (method, *action) {
                (Method::POST, "kill") => Ok(cluster.kill(i).await.map(|()| ok())?),
                (Method::POST, "restart") => Ok(cluster.restart(i).await.map(|()| ok())?),
                (Method::GET, "faults") => Ok(json_response(
                    StatusCode::OK,
                    &json!(cluster.faults(i).await?.current()),
                )),
                (Method::POST, "faults") => {
                    let faults: Faults = read_json(req).await?;
                    let mut problems = Vec::new();
                    faults.problems(&mut problems);
                    if !problems.is_empty() {
                        return Err(ApiError::BadRequest(problems.join("; ")).into());
                    }
                    cluster.faults(i).await?.set(faults);
                    Ok(ok())
                }
                _ => Err(ApiError::NoRoute.into()),
            }
        }
        _ => Err(ApiError::NoRoute.into()),
    }
}
