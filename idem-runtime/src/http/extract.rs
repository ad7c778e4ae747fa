//! axum extractors for what the layer puts in a request: its
//! [`IdempotencyKey`] and, in transaction mode, its [`RequestTx`]. On a
//! route whose key is not [`required`](super::Idempotency::required), a
//! request may come without one: take `Option<IdempotencyKey>` or
//! `Option<RequestTx<S>>` there, `None` for such a request.

use axum_core::extract::{FromRequestParts, OptionalFromRequestParts};
use axum_core::response::{IntoResponse, Response};
use http::StatusCode;
use http::request::Parts;

use super::problem::Problem;
use super::service::Keyless;
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

/// Why a handler could not be given the request's [`IdempotencyKey`] or
/// [`RequestTx`].
///
/// # Examples
///
/// ```
/// use axum_core::response::IntoResponse;
/// use idem_runtime::http::{NoKey, NotBehindTheLayer};
///
/// // a request without a key, on a route that lets such requests pass
/// let r = NoKey::NotSent("the request's idempotency key").into_response();
/// assert_eq!(r.status(), 400);
/// let r = NoKey::from(NotBehindTheLayer("the request's transaction")).into_response();
/// assert_eq!(r.status(), 500);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NoKey {
    /// The request came without an `Idempotency-Key` to a route that does
    /// not [require](super::Idempotency::required) one (or with a method
    /// the route takes no key on), and the handler takes what only a keyed
    /// request has: `400`, as for a route that requires a key. A handler
    /// that serves both takes an `Option`.
    #[error("{0} exists only for a request with an Idempotency-Key, and this one came without")]
    NotSent(&'static str),
    /// The route has no idempotency layer of that mode: `500`.
    #[error(transparent)]
    NotBehindTheLayer(#[from] NotBehindTheLayer),
}

impl IntoResponse for NoKey {
    fn into_response(self) -> Response {
        match self {
            NoKey::NotSent(what) => {
                tracing::debug!(
                    "a request without an Idempotency-Key reached a handler that takes {what}: 400"
                );
                Problem::NeededByHandler.response().into_response()
            }
            NoKey::NotBehindTheLayer(e) => e.into_response(),
        }
    }
}

impl IntoResponse for TransactionOver {
    fn into_response(self) -> Response {
        (StatusCode::INTERNAL_SERVER_ERROR, self.to_string()).into_response()
    }
}

/// What the layer put in the request for `T`: `Ok(None)` for a request it
/// let pass without a key.
fn find<T: Clone + Send + Sync + 'static>(
    parts: &Parts,
    what: &'static str,
) -> Result<Option<T>, NotBehindTheLayer> {
    match parts.extensions.get::<T>() {
        Some(found) => Ok(Some(found.clone())),
        None if parts.extensions.get::<Keyless>().is_some() => Ok(None),
        None => Err(NotBehindTheLayer(what)),
    }
}

const TX: &str = "the request's transaction";
const KEY: &str = "the request's idempotency key";

impl<S: TxStore + 'static, St: Sync> FromRequestParts<St> for RequestTx<S> {
    type Rejection = NoKey;

    async fn from_request_parts(parts: &mut Parts, _: &St) -> Result<Self, Self::Rejection> {
        find::<RequestTx<S>>(parts, TX)?.ok_or(NoKey::NotSent(TX))
    }
}

impl<S: TxStore + 'static, St: Sync> OptionalFromRequestParts<St> for RequestTx<S> {
    type Rejection = NotBehindTheLayer;

    async fn from_request_parts(
        parts: &mut Parts,
        _: &St,
    ) -> Result<Option<Self>, Self::Rejection> {
        find::<RequestTx<S>>(parts, TX)
    }
}

impl<St: Sync> FromRequestParts<St> for IdempotencyKey {
    type Rejection = NoKey;

    async fn from_request_parts(parts: &mut Parts, _: &St) -> Result<Self, Self::Rejection> {
        find::<IdempotencyKey>(parts, KEY)?.ok_or(NoKey::NotSent(KEY))
    }
}

impl<St: Sync> OptionalFromRequestParts<St> for IdempotencyKey {
    type Rejection = NotBehindTheLayer;

    async fn from_request_parts(
        parts: &mut Parts,
        _: &St,
    ) -> Result<Option<Self>, Self::Rejection> {
        find::<IdempotencyKey>(parts, KEY)
    }
}
