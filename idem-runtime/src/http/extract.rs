//! axum extractors for what the layer puts in a request: its
//! [`IdempotencyKey`] and, in transaction mode, its [`RequestTx`].

use axum_core::extract::FromRequestParts;
use axum_core::response::{IntoResponse, Response};
use http::StatusCode;
use http::request::Parts;

use super::{IdempotencyKey, RequestTx, TransactionOver};
use crate::store::TxStore;

/// A handler asked for what only the idempotency layer puts in a
/// request, on a route without it.
///
/// # Examples
///
/// ```
/// use axum_core::response::IntoResponse;
/// let r = idem_runtime::http::NotBehindTheLayer("the request's transaction").into_response();
/// assert_eq!(r.status(), 500);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{0} is asked for on a route that has no idempotency layer of that mode")]
pub struct NotBehindTheLayer(pub &'static str);

impl IntoResponse for NotBehindTheLayer {
    fn into_response(self) -> Response {
        tracing::error!(error = %self, "an idempotent route is misconfigured");
        (StatusCode::INTERNAL_SERVER_ERROR, self.to_string()).into_response()
    }
}

impl IntoResponse for TransactionOver {
    fn into_response(self) -> Response {
        (StatusCode::INTERNAL_SERVER_ERROR, self.to_string()).into_response()
    }
}

impl<S: TxStore + 'static, St: Sync> FromRequestParts<St> for RequestTx<S> {
    type Rejection = NotBehindTheLayer;

    async fn from_request_parts(parts: &mut Parts, _: &St) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<RequestTx<S>>()
            .cloned()
            .ok_or(NotBehindTheLayer("the request's transaction"))
    }
}

impl<St: Sync> FromRequestParts<St> for IdempotencyKey {
    type Rejection = NotBehindTheLayer;

    async fn from_request_parts(parts: &mut Parts, _: &St) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<IdempotencyKey>()
            .cloned()
            .ok_or(NotBehindTheLayer("the request's idempotency key"))
    }
}
