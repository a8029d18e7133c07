"""The rust checker's files: the checker (`checker`), what a sample's code attempts (`hacks`),
Rust source as tokens (`lexer`), and the harness compiled with every crate (`harness.rs`)."""
