//! An error type that borrows from the message stays the body's.

use idem_runtime::{Error, SqliteStore, SqliteTx, idempotent};

use super::Credit;

/// An error that borrows from the message.
#[derive(Debug)]
struct Borrowed<'a>(&'a str);

impl std::fmt::Display for Borrowed<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "no credit for {}", self.0)
    }
}

impl std::error::Error for Borrowed<'_> {}

#[idempotent(key = "id", ttl = "1h", store = "sqlite")]
async fn borrowing<'m>(tx: &mut SqliteTx<'_>, msg: &'m Credit) -> Result<u32, Borrowed<'m>> {
    let _ = tx;
    Err(Borrowed(&msg.id))
}

/// A transaction-mode handler whose error type is written with a lifetime
/// of its own compiles (the runtime does not try to see it as a
/// `dyn Error + 'static`), and its errors stay the body's.
#[tokio::test]
async fn an_error_type_that_borrows_stays_the_body_s() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("idem.db")).await.unwrap();
    store.migrate().await.unwrap();
    let msg = Credit { id: "c-1".into() };
    match borrowing(&store, &msg).await {
        Err(Error::Handler { error, .. }) => assert_eq!(error.0, "c-1"),
        other => panic!("{other:?}"),
    }
}
