//! What an idempotent handler returns when it did not fail.

/// The result of calling an idempotent handler: either its body ran now, or
/// the message was seen before and the recorded result comes back.
///
/// Both variants carry the handler's `Ok` value, so a consumer that does not
/// care which one happened can call [`Outcome::into_inner`].
///
/// # Examples
///
/// ```
/// use idem_runtime::Outcome;
///
/// let first: Outcome<u32> = Outcome::Executed(7);
/// let again: Outcome<u32> = Outcome::Duplicate(7);
/// assert!(!first.is_duplicate());
/// assert!(again.is_duplicate());
/// assert_eq!(first.into_inner(), again.into_inner());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[must_use = "an Outcome tells whether the body ran; use `into_inner()` if only the value matters"]
pub enum Outcome<T> {
    /// First delivery (or the first after the record expired): the body ran
    /// and its result was recorded.
    Executed(T),
    /// A repeat delivery: nothing was applied again; this is the recorded
    /// result of the delivery that took effect. (In lease mode and in
    /// transaction mode on SQLite, or on PostgreSQL and MySQL with
    /// `ClaimOrder::First`, the body did not run; with their default
    /// `ClaimOrder::Checked` it did not unless the delivery raced the first
    /// one's transaction; with `ClaimOrder::Last` it ran and its transaction
    /// was rolled back.)
    Duplicate(T),
}

impl<T> Outcome<T> {
    /// The handler's value, whichever way it was obtained.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(idem_runtime::Outcome::Duplicate("ok").into_inner(), "ok");
    /// ```
    pub fn into_inner(self) -> T {
        match self {
            Outcome::Executed(v) | Outcome::Duplicate(v) => v,
        }
    }

    /// A reference to the handler's value.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(*idem_runtime::Outcome::Executed(3).value(), 3);
    /// ```
    pub fn value(&self) -> &T {
        match self {
            Outcome::Executed(v) | Outcome::Duplicate(v) => v,
        }
    }

    /// `true` when the body ran for this call.
    ///
    /// # Examples
    ///
    /// ```
    /// assert!(idem_runtime::Outcome::Executed(()).is_executed());
    /// ```
    pub fn is_executed(&self) -> bool {
        matches!(self, Outcome::Executed(_))
    }

    /// `true` when this call was a repeat and nothing was applied again.
    ///
    /// # Examples
    ///
    /// ```
    /// assert!(idem_runtime::Outcome::Duplicate(()).is_duplicate());
    /// ```
    pub fn is_duplicate(&self) -> bool {
        matches!(self, Outcome::Duplicate(_))
    }

    /// Maps the value, keeping whether it was executed or a duplicate.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::Outcome;
    /// assert_eq!(Outcome::Duplicate(2).map(|v| v * 10), Outcome::Duplicate(20));
    /// ```
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Outcome<U> {
        match self {
            Outcome::Executed(v) => Outcome::Executed(f(v)),
            Outcome::Duplicate(v) => Outcome::Duplicate(f(v)),
        }
    }
}
