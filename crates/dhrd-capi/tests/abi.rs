//! The C ABI as separately compiled programs meet it: a program built against an older,
//! shorter `struct dhrd_options` (the library must fill and read only the bytes the caller
//! says it has), the shared library's versioned soname, one writer per backing file
//! across `dhrd_open` calls, and calls made in a child after fork().
#![allow(clippy::expect_used)] // tests fail loudly by design

use std::path::{Path, PathBuf};
use std::process::Command;

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// target/<profile>, where cargo puts the library's staticlib and cdylib.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test path");
    exe.parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .expect("target/<profile>")
}

/// Builds the library's static and shared forms (cargo builds only the rlib for tests).
fn libraries() -> (PathBuf, PathBuf) {
    static BUILT: std::sync::Mutex<bool> = std::sync::Mutex::new(false);
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if !*built {
        let release = profile_dir().file_name().is_some_and(|n| n == "release");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "-p", "dhrd-capi", "--lib"]);
        if release {
            cmd.arg("--release");
        }
        let o = cmd.output().expect("cargo build");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        *built = true;
    }
    (
        profile_dir().join("libdhrd_capi.a"),
        profile_dir().join("libdhrd_capi.so"),
    )
}

/// Compiles `source` against the committed header and the static library; the binary.
fn compile(dir: &Path, name: &str, source: &str) -> PathBuf {
    let (lib, _) = libraries();
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, source).expect("write C source");
    let exe = dir.join(name);
    let o = Command::new("cc")
        .args(["-Wall", "-Werror", "-I"])
        .arg(crate_dir().join("include"))
        .arg(&src)
        .arg(&lib)
        .args(["-lpthread", "-ldl", "-lm", "-o"])
        .arg(&exe)
        .output()
        .expect("cc");
    assert!(
        o.status.success(),
        "cc {name}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    exe
}

fn run(exe: &Path, arg: &Path) -> String {
    let o = Command::new(exe).arg(arg).output().expect("run");
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success() && out.lines().last() == Some("ok"),
        "{}: {out}{}",
        exe.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

/// A program compiled when `struct dhrd_options` ended at `tier_adopt` (it knows no later
/// field): the library must write no byte past that struct, read none, and use the
/// defaults for the fields the program does not have.
const OLD_LAYOUT: &str = r#"
#include <stdio.h>
#include <string.h>
#include "dhrd.h"

/* The first version of the struct, as an older dhrd.h declared it. */
struct old_options {
  uint32_t struct_bytes;
  uint32_t durability;
  uint32_t periodic_secs;
  uint64_t ram_budget_bytes;
  uint64_t chunk_bytes;
  bool create;
  uint64_t min_len_bytes;
  bool read_only;
  const char *backing_timing;
  const char *cache_policy;
  const char *cache_admit;
  const char *read_ahead;
  bool no_prefill;
  const char *tier_ssd_path;
  uint64_t tier_ssd_bytes;
  const char *tier_mode;
  const char *tier_ssd_timing;
  bool tier_adopt;
};

int main(int argc, char **argv) {
  struct { struct old_options o; unsigned char canary[256]; } w;
  memset(w.canary, 0xA5, sizeof w.canary);
  int err = dhrd_options_init((struct dhrd_options *)&w.o, sizeof w.o);
  if (err) { printf("init: %s\n", dhrd_strerror(err)); return 1; }
  for (size_t i = 0; i < sizeof w.canary; i++)
    if (w.canary[i] != 0xA5) { printf("init wrote past the caller's struct at +%zu\n", i); return 1; }
  if (w.o.struct_bytes != sizeof w.o) { printf("struct_bytes %u\n", w.o.struct_bytes); return 1; }
  w.o.create = true;
  w.o.min_len_bytes = 1 << 20;
  /* Garbage where a newer library's later fields would be: never read. */
  memset(w.canary, 0xFF, sizeof w.canary);
  dhrd_object *obj;
  err = dhrd_open(argv[1], (struct dhrd_options *)&w.o, &obj);
  if (err) { printf("open: %s\n", dhrd_strerror(err)); return 1; }
  err = dhrd_write(obj, "old", 3, 0);
  if (err) { printf("write: %s\n", dhrd_strerror(err)); return 1; }
  err = dhrd_close(obj);
  if (err) { printf("close: %s\n", dhrd_strerror(err)); return 1; }
  /* A size smaller than the first version is refused, not guessed at. */
  struct dhrd_options tiny;
  if (dhrd_options_init(&tiny, 4) != EINVAL) { printf("a 4-byte struct was accepted\n"); return 1; }
  printf("ok\n");
  return 0;
}
"#;

#[test]
fn a_program_built_against_a_shorter_struct_works_and_keeps_its_stack() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = format!("#include <errno.h>\n{OLD_LAYOUT}");
    let exe = compile(dir.path(), "old_layout", &src);
    let backing = dir.path().join("backing");
    run(&exe, &backing);
    assert_eq!(std::fs::read(&backing).expect("backing")[..3], *b"old");
}

#[test]
fn the_shared_library_has_a_versioned_soname() {
    let (_, so) = libraries();
    let o = Command::new("readelf")
        .arg("-d")
        .arg(&so)
        .output()
        .expect("readelf (binutils)");
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("Library soname: [libdhrd_capi.so.1]"),
        "{}: no versioned soname:\n{text}",
        so.display()
    );
}

/// Two opens of one backing file serve two RAM copies: the second must be refused, in
/// one process as across processes.
const TWO_OPENS: &str = r#"
#include <errno.h>
#include <stdio.h>
#include "dhrd.h"

int main(int argc, char **argv) {
  struct dhrd_options o;
  dhrd_options_init(&o, sizeof o);
  o.create = true;
  o.min_len_bytes = 1 << 20;
  dhrd_object *a, *b;
  int err = dhrd_open(argv[1], &o, &a);
  if (err) { printf("first open: %s\n", dhrd_strerror(err)); return 1; }
  err = dhrd_open(argv[1], &o, &b);
  if (err != EBUSY) { printf("second open of the same file: %d (%s), want EBUSY\n", err, dhrd_strerror(err)); return 1; }
  o.read_only = true;
  err = dhrd_open(argv[1], &o, &b);
  if (err != EBUSY) { printf("read-only open beside a writer: %d, want EBUSY\n", err); return 1; }
  dhrd_close(a);
  o.read_only = false;
  err = dhrd_open(argv[1], &o, &b);
  if (err) { printf("open after close: %s\n", dhrd_strerror(err)); return 1; }
  dhrd_close(b);
  printf("ok\n");
  return 0;
}
"#;

#[test]
fn one_backing_file_has_one_writer() {
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = compile(dir.path(), "two_opens", TWO_OPENS);
    run(&exe, &dir.path().join("backing"));
}

/// After fork() the child has none of dhrd's threads, and locks other threads held stay
/// held: a call there must fail at once with ECHILD rather than hang or act on a copy.
const FORKED: &str = r#"
#include <errno.h>
#include <stdio.h>
#include <unistd.h>
#include <sys/wait.h>
#include "dhrd.h"

int main(int argc, char **argv) {
  struct dhrd_options o;
  dhrd_options_init(&o, sizeof o);
  o.create = true;
  o.min_len_bytes = 1 << 20;
  dhrd_object *a;
  int err = dhrd_open(argv[1], &o, &a);
  if (err) { printf("open: %s\n", dhrd_strerror(err)); return 1; }
  pid_t pid = fork();
  if (pid == 0) {
    alarm(20); /* a hang fails the test instead of stalling it */
    char buf[16];
    size_t n;
    int r = dhrd_read(a, buf, sizeof buf, 0, &n);
    int w = dhrd_write(a, "x", 1, 0);
    _exit(r == ECHILD && w == ECHILD ? 0 : 10 + (r == ECHILD));
  }
  int st;
  waitpid(pid, &st, 0);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) { printf("child: status %d\n", st); return 1; }
  /* The parent is unaffected. */
  err = dhrd_write(a, "p", 1, 0);
  if (err) { printf("parent write: %s\n", dhrd_strerror(err)); return 1; }
  dhrd_close(a);
  printf("ok\n");
  return 0;
}
"#;

#[test]
fn calls_in_a_forked_child_fail_with_echild() {
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = compile(dir.path(), "forked", FORKED);
    run(&exe, &dir.path().join("backing"));
}
