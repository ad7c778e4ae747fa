//! The `idem` binary; everything is in the library (`lib.rs`), which the
//! CLI's tests depend on to build it with every broker.

fn main() -> std::process::ExitCode {
    idem_cli::main()
}
