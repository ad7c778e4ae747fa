//! What a route's idempotency is made of: its namespace, how long a key
//! stands, how keys are scoped, what makes two requests the same, and what
//! is recorded.

use std::panic::Location;
use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;
use http::{HeaderName, Method, StatusCode};

use crate::registry::{self, Clash, HandlerSpec, Mode, RegistryError};

/// Where a request's key belongs: the principal or tenant the application
/// authenticated, so that one client's key never meets another's.
pub(crate) type Scope = Arc<dyn Fn(&Parts) -> Option<String> + Send + Sync>;

/// What a retry gets while the first request with its key is still running.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use idem_runtime::http::{Idempotency, InFlight};
///
/// let route = Idempotency::unscoped("http_payments", Duration::from_secs(86_400))
///     .in_flight(InFlight::Wait(Duration::from_secs(2)));
/// # let _ = route;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum InFlight {
    /// `409 Conflict` at once, with a `Retry-After` (the draft's answer).
    Conflict,
    /// Wait up to this long for the first request to settle, then answer
    /// its stored response (or run, if it released its key); `409` if it
    /// is still running then.
    Wait(Duration),
}

/// Which parts of a request make its fingerprint: a key sent again with a
/// request that differs in one of them is refused with `422`.
///
/// The default takes the method, the path, the query and the body.
///
/// # Examples
///
/// ```
/// use idem_runtime::http::Fingerprint;
///
/// // the body alone, and the tenant header
/// let fp = Fingerprint::default().without_method().without_path().without_query().header("x-tenant");
/// # let _ = fp;
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fingerprint {
    pub(crate) method: bool,
    pub(crate) path: bool,
    pub(crate) query: bool,
    pub(crate) body: bool,
    pub(crate) headers: Vec<HeaderName>,
}

impl Default for Fingerprint {
    fn default() -> Self {
        Fingerprint {
            method: true,
            path: true,
            query: true,
            body: true,
            headers: Vec::new(),
        }
    }
}

impl Fingerprint {
    /// Leaves the method out.
    ///
    /// # Examples
    ///
    /// ```
    /// let fp = idem_runtime::http::Fingerprint::default().without_method();
    /// # let _ = fp;
    /// ```
    pub fn without_method(mut self) -> Self {
        self.method = false;
        self
    }

    /// Leaves the path out (a key may then be sent to another route that
    /// shares the namespace).
    ///
    /// # Examples
    ///
    /// ```
    /// let fp = idem_runtime::http::Fingerprint::default().without_path();
    /// # let _ = fp;
    /// ```
    pub fn without_path(mut self) -> Self {
        self.path = false;
        self
    }

    /// Leaves the query string out.
    ///
    /// # Examples
    ///
    /// ```
    /// let fp = idem_runtime::http::Fingerprint::default().without_query();
    /// # let _ = fp;
    /// ```
    pub fn without_query(mut self) -> Self {
        self.query = false;
        self
    }

    /// Leaves the body out.
    ///
    /// # Examples
    ///
    /// ```
    /// let fp = idem_runtime::http::Fingerprint::default().without_body();
    /// # let _ = fp;
    /// ```
    pub fn without_body(mut self) -> Self {
        self.body = false;
        self
    }

    /// Adds a request header's values (absent and empty differ).
    ///
    /// # Examples
    ///
    /// ```
    /// let fp = idem_runtime::http::Fingerprint::default().header("content-type");
    /// # let _ = fp;
    /// ```
    pub fn header(mut self, name: &'static str) -> Self {
        self.headers.push(HeaderName::from_static(name));
        self
    }

    /// What the handler spec says of the fingerprint.
    fn described(&self) -> &'static str {
        "the request's method, path, query, body and headers, as configured"
    }
}

/// How a route's requests are made idempotent: built once, then turned into
/// a layer over a store with [`lease`](Idempotency::lease) or
/// [`transaction`](Idempotency::transaction).
///
/// Keys are scoped first: [`scoped_by`](Idempotency::scoped_by) takes the
/// function that names the caller (the authenticated principal, a tenant),
/// and a key is only ever matched within its caller's scope.
/// [`unscoped`](Idempotency::unscoped) shares one namespace between every
/// caller, for services whose callers trust each other.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use idem_runtime::http::Idempotency;
///
/// let route = Idempotency::scoped_by("http_payments", Duration::from_secs(86_400), |parts| {
///     // the principal an authentication layer put in the request
///     parts.headers.get("x-account").and_then(|v| v.to_str().ok()).map(str::to_owned)
/// });
/// # let _ = route;
/// ```
#[derive(Clone)]
pub struct Idempotency {
    pub(crate) name: &'static str,
    pub(crate) ttl: Duration,
    pub(crate) lease: Duration,
    pub(crate) scope: Option<Scope>,
    pub(crate) methods: Vec<Method>,
    pub(crate) required: bool,
    pub(crate) fingerprint: Fingerprint,
    pub(crate) in_flight: InFlight,
    pub(crate) max_request_body: usize,
    pub(crate) max_stored_body: usize,
    pub(crate) stored_headers: Vec<HeaderName>,
    pub(crate) recorded: fn(StatusCode) -> bool,
    pub(crate) grace: Duration,
    pub(crate) at: &'static Location<'static>,
}

impl std::fmt::Debug for Idempotency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idempotency")
            .field("name", &self.name)
            .field("ttl", &self.ttl)
            .field("scoped", &self.scope.is_some())
            .field("methods", &self.methods)
            .field("required", &self.required)
            .field("grace", &self.grace)
            .finish_non_exhaustive()
    }
}

/// How long a request's call runs on after its caller went away, unless
/// [`Idempotency::grace`] says otherwise: 30 s, as long as the default
/// lease, and the time Kubernetes gives a pod to stop.
///
/// # Examples
///
/// ```
/// assert_eq!(idem_runtime::http::DEFAULT_GRACE.as_secs(), 30);
/// ```
pub const DEFAULT_GRACE: Duration = Duration::from_secs(30);

/// Whether a response with this status is recorded for the key (so that a
/// retry gets it back) or its key released (so that a retry runs again):
/// every status but the server errors and the four client errors that mean
/// "try again" (408, 409, 425, 429).
///
/// # Examples
///
/// ```
/// use http::StatusCode;
/// use idem_runtime::http::recorded_by_default;
///
/// assert!(recorded_by_default(StatusCode::CREATED));
/// assert!(recorded_by_default(StatusCode::PAYMENT_REQUIRED));
/// assert!(!recorded_by_default(StatusCode::TOO_MANY_REQUESTS));
/// assert!(!recorded_by_default(StatusCode::SERVICE_UNAVAILABLE));
/// ```
pub fn recorded_by_default(status: StatusCode) -> bool {
    !(status.is_server_error()
        || matches!(status.as_u16(), 408 | 409 | 425 | 429)
        || status.is_informational())
}

/// Whether a response with this status is recorded, as Stripe records
/// them: every status [`recorded_by_default`] records, and the handler's
/// own server errors but `503 Service Unavailable` (the handler's way to
/// say "try again", as `429` is). A retry of the key then gets the server
/// error back, with `idempotent-replayed: true`, until the ttl ends: the
/// client must send a new key to try again. In transaction mode a
/// recorded server error is recorded without the handler's writes (they
/// roll back, as a final error's do); in lease mode, whatever the handler
/// did stands. The layer's own answers (a store it cannot reach, a failed
/// response body) are never recorded.
///
/// For [`Idempotency::recorded`]; the guide's
/// [HTTP chapter](crate::guide::http#server-errors) says when to choose it.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use http::StatusCode;
/// use idem_runtime::http::{Idempotency, recorded_with_server_errors};
///
/// assert!(recorded_with_server_errors(StatusCode::INTERNAL_SERVER_ERROR));
/// assert!(recorded_with_server_errors(StatusCode::BAD_GATEWAY));
/// assert!(!recorded_with_server_errors(StatusCode::SERVICE_UNAVAILABLE));
/// assert!(!recorded_with_server_errors(StatusCode::TOO_MANY_REQUESTS));
/// let route = Idempotency::unscoped("http_charges", Duration::from_secs(86_400))
///     .recorded(recorded_with_server_errors);
/// # let _ = route;
/// ```
pub fn recorded_with_server_errors(status: StatusCode) -> bool {
    recorded_by_default(status)
        || (status.is_server_error() && status != StatusCode::SERVICE_UNAVAILABLE)
}

impl Idempotency {
    #[track_caller]
    fn new(name: &'static str, ttl: Duration, scope: Option<Scope>) -> Self {
        Idempotency {
            name,
            ttl,
            lease: Duration::from_secs(30),
            scope,
            methods: vec![Method::POST, Method::PATCH],
            required: true,
            fingerprint: Fingerprint::default(),
            in_flight: InFlight::Conflict,
            max_request_body: 1 << 20,
            max_stored_body: 64 << 10,
            stored_headers: vec![
                http::header::CONTENT_TYPE,
                http::header::LOCATION,
                http::header::CONTENT_LANGUAGE,
            ],
            recorded: recorded_by_default,
            grace: DEFAULT_GRACE,
            at: Location::caller(),
        }
    }

    /// Keys scoped by `scope`: the caller's identity, taken from the
    /// request (an authentication layer's extension, a verified header). A
    /// request it names no caller for is refused with `401`, and nothing
    /// is recorded. `name` is the namespace in the store (stable across
    /// deploys, as a handler's); `ttl` how long a key stands.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem_runtime::http::Idempotency;
    ///
    /// #[derive(Clone)]
    /// struct Principal(String);
    ///
    /// let route = Idempotency::scoped_by("http_orders", Duration::from_secs(3_600), |parts| {
    ///     parts.extensions.get::<Principal>().map(|p| p.0.clone())
    /// });
    /// # let _ = route;
    /// ```
    #[track_caller]
    pub fn scoped_by<F>(name: &'static str, ttl: Duration, scope: F) -> Self
    where
        F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    {
        Idempotency::new(name, ttl, Some(Arc::new(scope)))
    }

    /// Keys in one namespace for every caller: any client that sends a key
    /// another sent gets that one's response. For internal services only.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let route = idem_runtime::http::Idempotency::unscoped("http_ledger", Duration::from_secs(600));
    /// # let _ = route;
    /// ```
    #[track_caller]
    pub fn unscoped(name: &'static str, ttl: Duration) -> Self {
        Idempotency::new(name, ttl, None)
    }

    /// The methods that take a key (POST and PATCH by default); requests of
    /// other methods pass through untouched.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use http::Method;
    /// let route = idem_runtime::http::Idempotency::unscoped("http_docs", Duration::from_secs(600))
    ///     .methods([Method::POST, Method::PUT, Method::DELETE]);
    /// # let _ = route;
    /// ```
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.methods = methods.into_iter().collect();
        self
    }

    /// Whether a request of those methods must carry a key (`true`, the
    /// default: `400` without one) or may go without (then it runs without
    /// a claim, a record or a transaction: a handler that takes
    /// [`IdempotencyKey`](super::IdempotencyKey) or
    /// [`RequestTx`](super::RequestTx) answers it `400`
    /// ([`NoKey::NotSent`](super::NoKey::NotSent)); one that takes an
    /// `Option` of them gets `None`).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let route = idem_runtime::http::Idempotency::unscoped("http_search", Duration::from_secs(600))
    ///     .required(false);
    /// # let _ = route;
    /// ```
    pub fn required(mut self, required: bool) -> Self {
        self.required = required;
        self
    }

    /// How long a request's call may run on once nobody waits for it any
    /// more (its client hung up, a timeout layer or a graceful shutdown
    /// dropped the request): 30 s by default ([`DEFAULT_GRACE`]).
    ///
    /// Every request the layer claims a key for runs on a task of its own,
    /// so what the client or the server stack does to the request never
    /// stops the handler halfway: a call whose caller went away goes on to
    /// its recorded outcome, and the client's retry gets `409` until then
    /// and the recorded response after. A call still running `grace` after
    /// its caller went away is dropped: counted in
    /// [`BODIES_DROPPED`](crate::metric::BODIES_DROPPED) when its handler
    /// was running; in transaction mode its writes roll back, in lease mode
    /// its key is held for one more lease before a retry may run it again.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let route = idem_runtime::http::Idempotency::unscoped("http_reports", Duration::from_secs(600))
    ///     .grace(Duration::from_secs(120));
    /// # let _ = route;
    /// ```
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// What makes two requests with one key the same request.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem_runtime::http::{Fingerprint, Idempotency};
    /// let route = Idempotency::unscoped("http_payments", Duration::from_secs(600))
    ///     .fingerprint(Fingerprint::default().without_query());
    /// # let _ = route;
    /// ```
    pub fn fingerprint(mut self, fingerprint: Fingerprint) -> Self {
        self.fingerprint = fingerprint;
        self
    }

    /// What a retry gets while the first request runs ([`InFlight::Conflict`]
    /// by default).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem_runtime::http::{Idempotency, InFlight};
    /// let route = Idempotency::unscoped("http_payments", Duration::from_secs(600))
    ///     .in_flight(InFlight::Wait(Duration::from_millis(500)));
    /// # let _ = route;
    /// ```
    pub fn in_flight(mut self, in_flight: InFlight) -> Self {
        self.in_flight = in_flight;
        self
    }

    /// How long a lease-mode claim stays the running request's without the
    /// runtime extending it (30 s by default; it is extended while the
    /// handler runs): a server that dies mid-request frees its keys after
    /// this long.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let route = idem_runtime::http::Idempotency::unscoped("http_sms", Duration::from_secs(600))
    ///     .lease_duration(Duration::from_secs(10));
    /// # let _ = route;
    /// ```
    pub fn lease_duration(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// The largest request body the layer reads (1 MiB by default): a
    /// larger one is refused with `413`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let route = idem_runtime::http::Idempotency::unscoped("http_uploads", Duration::from_secs(600))
    ///     .max_request_body(8 << 20);
    /// # let _ = route;
    /// ```
    pub fn max_request_body(mut self, bytes: usize) -> Self {
        self.max_request_body = bytes;
        self
    }

    /// The largest response body that is recorded (64 KiB by default). A
    /// larger response is sent whole to the request that ran, and recorded
    /// without its body: a retry gets its status and headers, an empty
    /// body, and `idempotent-replayed: body-not-stored`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let route = idem_runtime::http::Idempotency::unscoped("http_exports", Duration::from_secs(600))
    ///     .max_stored_body(1 << 20);
    /// # let _ = route;
    /// ```
    pub fn max_stored_body(mut self, bytes: usize) -> Self {
        self.max_stored_body = bytes;
        self
    }

    /// The response headers recorded and replayed (`content-type`,
    /// `location` and `content-language` by default). Headers whose values
    /// are not visible ASCII are not recorded.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let route = idem_runtime::http::Idempotency::unscoped("http_orders", Duration::from_secs(600))
    ///     .stored_headers(["content-type", "location", "etag"]);
    /// # let _ = route;
    /// ```
    pub fn stored_headers(mut self, names: impl IntoIterator<Item = &'static str>) -> Self {
        self.stored_headers = names.into_iter().map(HeaderName::from_static).collect();
        self
    }

    /// Which statuses are recorded; the others release the key, and in
    /// transaction mode roll the handler's writes back
    /// ([`recorded_by_default`] unless set: the handler's server errors
    /// are released; [`recorded_with_server_errors`] records them). In
    /// transaction mode a recorded server error (5xx) is recorded without
    /// the handler's writes, which roll back; a recorded 2xx, 3xx or 4xx
    /// commits with them.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use http::StatusCode;
    /// // record successes only: every client error may be retried
    /// let route = idem_runtime::http::Idempotency::unscoped("http_orders", Duration::from_secs(600))
    ///     .recorded(|s: StatusCode| s.is_success());
    /// # let _ = route;
    /// ```
    pub fn recorded(mut self, recorded: fn(StatusCode) -> bool) -> Self {
        self.recorded = recorded;
        self
    }

    /// The handler description the store's records and the runtime's
    /// telemetry know the route by, made once per layer. A name that a
    /// `#[idempotent]` handler of the binary has is refused: their keys
    /// would share a namespace.
    pub(crate) fn spec(
        &self,
        store: &'static str,
        mode: Mode,
    ) -> Result<&'static HandlerSpec, RegistryError> {
        let spec: &'static HandlerSpec = Box::leak(Box::new(HandlerSpec {
            name: self.name,
            function: "http route",
            key: "Idempotency-Key",
            ttl: self.ttl,
            lease: self.lease,
            store,
            mode,
            module: "http",
            file: self.at.file(),
            line: self.at.line(),
            fingerprint: Some(self.fingerprint.described()),
            max_attempts: None,
        }));
        let mut handlers: Vec<&'static HandlerSpec> = registry::handlers()
            .filter(|h| h.name == self.name)
            .collect();
        if handlers.is_empty() {
            return Ok(spec);
        }
        handlers.push(spec);
        Err(RegistryError::DuplicateNames {
            clashes: vec![Clash {
                name: self.name,
                handlers,
            }],
        })
    }
}
