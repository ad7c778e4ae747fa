//! The store's Lua library: the function bodies of `scripts.rs`, each
//! registered as a function of `KEYS` and `ARGV` in one library named by
//! its content, and how one of them is called (`FCALL`).

use redis::{Cmd, Script};

use super::scripts;

/// One of the store's Lua functions, by its name in the store's library.
#[derive(Debug)]
pub(super) struct Lua {
    name: String,
}

impl Lua {
    /// `FCALL <name> 1 key`, for the arguments to follow (room made for
    /// eleven in all, a failure's, and the usual sizes with a
    /// `traceparent`, so the command is not grown).
    pub(super) fn on(&self, key: &str) -> Cmd {
        let mut cmd = Cmd::with_capacity(11, 224 + self.name.len() + key.len());
        cmd.arg("FCALL").arg(&self.name).arg(1).arg(key);
        cmd
    }
}

impl Lua {
    /// `FCALL <name> <n> key...` on the `n` keys given, for the arguments
    /// to follow (room made for `args` of them, of `bytes` in all).
    pub(super) fn on_keys<'k>(
        &self,
        keys: impl ExactSizeIterator<Item = &'k str>,
        args: usize,
        bytes: usize,
    ) -> Cmd {
        let mut cmd = Cmd::with_capacity(3 + keys.len() + args, 32 + self.name.len() + bytes);
        cmd.arg("FCALL").arg(&self.name).arg(keys.len());
        for key in keys {
            cmd.arg(key);
        }
        cmd
    }
}

/// The store's Lua functions, in one library (`FUNCTION LOAD`) named by
/// its content, `idem_<16 hex digits>`: a server holds the library of each
/// release that used it, side by side, and loads it again if it lost it
/// (a restart without persistence, a new cluster node).
#[derive(Debug)]
pub(super) struct Library {
    /// The library's source, as `FUNCTION LOAD` takes it.
    pub(super) source: String,
    pub(super) swap: Lua,
    pub(super) hash_claim: Lua,
    pub(super) complete: Lua,
    pub(super) complete_many: Lua,
    pub(super) fail: Lua,
    pub(super) release: Lua,
    pub(super) extend: Lua,
    pub(super) forget: Lua,
}

impl Library {
    pub(super) fn new() -> Library {
        use std::fmt::Write as _;
        const VERSION: &str = "@version@";
        let functions = [
            ("swap", scripts::SWAP),
            ("hash_claim", scripts::HASH_CLAIM),
            ("complete", scripts::COMPLETE_ONE),
            ("complete_many", scripts::COMPLETE_MANY),
            ("fail", scripts::FAIL),
            ("release", scripts::RELEASE),
            ("extend", scripts::EXTEND),
            ("forget", scripts::FORGET),
        ];
        let mut body = String::from(scripts::PRELUDE);
        // Written to a String, which cannot fail.
        let _ = write!(
            body,
            "{}local function complete(KEYS, ARGV)\n{}{}\nend\n",
            scripts::COMPLETE_STRING,
            scripts::COMPLETE_KEY,
            scripts::COMPLETE
        );
        for (name, code) in functions {
            // Writing to a String cannot fail.
            let _ = write!(
                body,
                "redis.register_function('idem_{VERSION}_{name}', function(KEYS, ARGV)\n{code}\nend)\n"
            );
        }
        let version = Script::new(&body).get_hash()[..16].to_owned();
        let source = format!(
            "#!lua name=idem_{version}\n{}",
            body.replace(VERSION, &version)
        );
        let lua = |name: &str| Lua {
            name: format!("idem_{version}_{name}"),
        };
        Library {
            source,
            swap: lua("swap"),
            hash_claim: lua("hash_claim"),
            complete: lua("complete"),
            complete_many: lua("complete_many"),
            fail: lua("fail"),
            release: lua("release"),
            extend: lua("extend"),
            forget: lua("forget"),
        }
    }
}
