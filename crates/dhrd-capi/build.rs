//! Generates the C header from the crate's exported items into OUT_DIR; a test compares it
//! with the committed `include/dhrd.h`, so C users need no build step and the committed
//! header cannot go stale unnoticed.

fn main() {
    println!("cargo:rerun-if-changed=src/lib.rs");
    println!("cargo:rerun-if-changed=cbindgen.toml");
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".into());
    let out = std::env::var("OUT_DIR").unwrap_or_else(|_| ".".into());
    let config = cbindgen::Config::from_file(format!("{dir}/cbindgen.toml")).unwrap_or_default();
    match cbindgen::generate_with_config(&dir, config) {
        Ok(b) => {
            b.write_to_file(format!("{out}/dhrd.h"));
        }
        // The library builds without it; the header test then reports the failure.
        Err(e) => println!("cargo:warning=cbindgen: {e}"),
    }
}
