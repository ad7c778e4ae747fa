//! Compile-time checks of idem with every store feature off; see `tests/`.
