//! Integration tests of idem live in `tests/`.
