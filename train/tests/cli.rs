//! The `sparkling-train` command line's output handling (issue 15).

use std::process::Command;

/// `--help` into a full disk is an error naming standard output (clap's printer ignored the
/// failed write and exited 0); into a pipe the help is printed whole with status 0.
#[test]
fn help_into_a_full_disk_is_an_error() {
    let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
        eprintln!("skipping: no /dev/full");
        return;
    };
    let o = Command::new(env!("CARGO_BIN_EXE_sparkling-train")).args(["train", "--help"]).stdout(full).output().unwrap();
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(e.contains("standard output") && !e.contains("panicked"), "{e}");
    let o = Command::new(env!("CARGO_BIN_EXE_sparkling-train")).args(["train", "--help"]).output().unwrap();
    assert!(o.status.success() && String::from_utf8_lossy(&o.stdout).contains("--steps"));
}
