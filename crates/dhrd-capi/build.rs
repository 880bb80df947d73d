//! Generates the C header from the crate's exported items into OUT_DIR; a test compares it
//! with the committed `include/dhrd.h`, so C users need no build step and the committed
//! header cannot go stale unnoticed. Gives the shared library its versioned soname.

/// The soname: `libdhrd_capi.so.` and the crate's `DHRD_ABI_VERSION` (a test checks that
/// the two agree). A program linked against the library records this name, so a library
/// with an incompatible ABI (another number) is never loaded in its place.
const SONAME: &str = "libdhrd_capi.so.1";

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,{SONAME}");
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
