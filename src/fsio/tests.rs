use super::*;

fn tmpdir() -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "sparkling-fsio-{}-{}",
        std::process::id(),
        sibling(Path::new("x"), "t").display().to_string().replace(['/', '.'], "")
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn listing(d: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(d).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

#[test]
fn devices_links_and_models_are_never_replaced() {
    let d = tmpdir();
    // A device is written through and stays a device.
    write_bytes(Path::new("/dev/null"), b"{}").unwrap();
    assert!(!std::fs::symlink_metadata("/dev/null").unwrap().file_type().is_file());
    // A symbolic link stays a link; its target gets the bytes.
    let real = d.join("real.json");
    std::fs::write(&real, "old").unwrap();
    #[cfg(unix)]
    {
        let link = d.join("link.json");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        write_bytes(&link, b"new").unwrap();
        assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
        assert_eq!(std::fs::read_to_string(&real).unwrap(), "new");
    }
    // A model file (by name or by GGUF magic) is refused and left as it was.
    let gguf = d.join("model.bin");
    std::fs::write(&gguf, b"GGUF\x03\0\0\0").unwrap();
    let e = write_bytes(&gguf, b"{}").unwrap_err().to_string();
    assert!(e.contains("holds a model"), "{e}");
    assert_eq!(std::fs::read(&gguf).unwrap(), b"GGUF\x03\0\0\0");
    let st = d.join("w.safetensors");
    std::fs::write(&st, b"x").unwrap();
    assert!(write_bytes(&st, b"{}").is_err());
    assert!(check_writable(&st, "--json").is_err());
    assert_eq!(std::fs::read(&st).unwrap(), b"x");
    // The config.json of a directory with weights is part of the model (writing
    // `--stats-json DIR/config.json` over it would break a drafter); a lone config.json is not.
    let cfg = d.join("config.json");
    std::fs::write(&cfg, "{\"model\": 1}").unwrap();
    assert!(check_writable(&cfg, "--stats-json").unwrap_err().to_string().contains("holds a model"));
    assert!(write_bytes(&cfg, b"{}").is_err());
    assert_eq!(std::fs::read_to_string(&cfg).unwrap(), "{\"model\": 1}");
    let lone = tmpdir();
    write_bytes(&lone.join("config.json"), b"{}").unwrap();
    write_bytes(&lone.join("config.json"), b"{1}").unwrap();
    assert!(same_file(&lone.join("config.json"), &lone.join(".").join("config.json")) && !same_file(&lone.join("config.json"), &cfg));
    // A hard link of a file is the same file; a copy is not.
    #[cfg(unix)]
    {
        std::fs::hard_link(lone.join("config.json"), lone.join("linked.json")).unwrap();
        std::fs::copy(lone.join("config.json"), lone.join("copied.json")).unwrap();
        assert!(same_file(&lone.join("config.json"), &lone.join("linked.json")));
        assert!(!same_file(&lone.join("config.json"), &lone.join("copied.json")));
    }
    let _ = std::fs::remove_dir_all(&lone);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn failed_write_leaves_the_old_file_and_no_temporary() {
    let d = tmpdir();
    let p = d.join("a.json");
    std::fs::write(&p, "old").unwrap();
    let r = write_with(&p, |t| {
        std::fs::write(t, "partial").unwrap();
        Err(Error::Input("boom".into()))
    });
    assert!(r.is_err());
    assert_eq!(std::fs::read_to_string(&p).unwrap(), "old");
    assert_eq!(listing(&d), vec!["a.json"]);
    write_bytes(&p, b"new").unwrap();
    assert_eq!(std::fs::read_to_string(&p).unwrap(), "new");
    assert_eq!(listing(&d), vec!["a.json"]);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn temporaries_of_dead_processes_are_swept() {
    let d = tmpdir();
    let out = d.join("ckpt");
    // pid 4294967295 never runs (Linux pid_max ≤ 2^22); our own pid's files are kept.
    std::fs::create_dir_all(d.join(".ckpt.tmp-4294967295-0")).unwrap();
    std::fs::write(d.join(".ckpt.tmp-4294967295-0/config.json"), "{}").unwrap();
    std::fs::write(d.join(format!(".ckpt.probe-{}-7", std::process::id())), "").unwrap();
    std::fs::write(d.join(".other.tmp-4294967295-0"), "").unwrap();
    publish_dir(&out, |t| std::fs::write(t.join("config.json"), "1").map_err(|e| Error::Input(e.to_string()))).unwrap();
    let mut want = vec![format!(".ckpt.probe-{}-7", std::process::id()), ".other.tmp-4294967295-0".to_string(), "ckpt".to_string()];
    if !cfg!(target_os = "linux") {
        want.insert(0, ".ckpt.tmp-4294967295-0".into());
    }
    want.sort();
    assert_eq!(listing(&d), want);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn out_dir_with_a_model_needs_force() {
    let d = tmpdir();
    check_out_dir(&d, false, "--out").unwrap();
    std::fs::write(d.join("model.safetensors"), "x").unwrap();
    let e = check_out_dir(&d, false, "--out").unwrap_err().to_string();
    assert!(e.contains("--force") && e.contains("--out"), "{e}");
    check_out_dir(&d, true, "--out").unwrap();
    let f = d.join("model.safetensors");
    assert!(check_out_dir(&f, true, "--out").is_err());
    std::fs::remove_dir_all(&d).unwrap();
}

/// Two writers of one new directory: the one that finishes second refuses to replace what
/// the first published meanwhile (concurrent `synth-target --out` runs must not replace
/// each other's output).
#[test]
fn publish_dir_does_not_replace_a_checkpoint_written_meanwhile() {
    let d = tmpdir();
    let out = d.join("ckpt");
    let e = publish_dir(&out, |t| {
        publish_dir(&out, |t2| std::fs::write(t2.join("config.json"), "first").map_err(|e| Error::Input(e.to_string())))?;
        std::fs::write(t.join("config.json"), "second").map_err(|e| Error::Input(e.to_string()))
    })
    .unwrap_err()
    .to_string();
    assert!(e.contains("another process") && e.contains("--force"), "{e}");
    assert_eq!(std::fs::read_to_string(out.join("config.json")).unwrap(), "first");
    assert_eq!(listing(&d), vec!["ckpt"], "the loser's temporary is removed");
    assert!(
        is_replaced_file("model-00001-of-00003.safetensors") && !is_replaced_file("model-x-of-3.safetensors") && !is_replaced_file("ckpt-000001.safetensors")
    );
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn publish_dir_is_all_or_nothing() {
    let d = tmpdir();
    let out = d.join("ckpt");
    let r = publish_dir(&out, |t| {
        std::fs::write(t.join("config.json"), "{}").unwrap();
        Err(Error::Input("allocation failed".into()))
    });
    assert!(r.is_err());
    assert!(listing(&d).is_empty(), "{:?}", listing(&d));
    publish_dir(&out, |t| {
        std::fs::write(t.join("config.json"), "1").map_err(|e| Error::Input(e.to_string()))?;
        std::fs::write(t.join("model.safetensors"), "1").map_err(|e| Error::Input(e.to_string()))
    })
    .unwrap();
    // Into an existing directory: the checkpoint is replaced as a whole (the stale shard the
    // new build did not write goes), other files and folders are carried over.
    std::fs::write(out.join("README.md"), "keep").unwrap();
    std::fs::write(out.join("model-00002-of-00002.safetensors"), "stale").unwrap();
    std::fs::write(out.join("model.safetensors.index.json"), "stale").unwrap();
    // Files that are not this checkpoint's stay: `--force` must not delete every
    // `*.safetensors` and `*.gguf`, training checkpoints included.
    std::fs::write(out.join("ckpt-000004.safetensors"), "train").unwrap();
    std::fs::write(out.join("vocab.gguf"), "v").unwrap();
    std::fs::create_dir(out.join("notes")).unwrap();
    std::fs::write(out.join("notes").join("a.txt"), "n").unwrap();
    #[cfg(unix)]
    let inode = |p: &Path| std::fs::metadata(p).map(|m| std::os::unix::fs::MetadataExt::ino(&m)).unwrap();
    #[cfg(unix)]
    let readme = inode(&out.join("README.md"));
    publish_dir(&out, |t| {
        std::fs::write(t.join("config.json"), "2").map_err(|e| Error::Input(e.to_string()))?;
        std::fs::write(t.join("model.safetensors"), "2").map_err(|e| Error::Input(e.to_string()))
    })
    .unwrap();
    assert_eq!(listing(&out), vec!["README.md", "ckpt-000004.safetensors", "config.json", "model.safetensors", "notes", "vocab.gguf"]);
    assert_eq!(std::fs::read_to_string(out.join("ckpt-000004.safetensors")).unwrap(), "train");
    assert_eq!(std::fs::read_to_string(out.join("config.json")).unwrap(), "2");
    assert_eq!(std::fs::read_to_string(out.join("model.safetensors")).unwrap(), "2");
    assert_eq!(std::fs::read_to_string(out.join("README.md")).unwrap(), "keep");
    #[cfg(unix)]
    assert_eq!(inode(&out.join("README.md")), readme, "carried as a hard link, not copied");
    assert_eq!(std::fs::read_to_string(out.join("notes").join("a.txt")).unwrap(), "n");
    // No temporary or set-aside directory remains.
    assert_eq!(listing(&d), vec!["ckpt"]);
    // Through a symbolic link: the directory it names is replaced, the link stays a link.
    #[cfg(unix)]
    {
        let link = d.join("link");
        std::os::unix::fs::symlink(&out, &link).unwrap();
        publish_dir(&link, |t| std::fs::write(t.join("config.json"), "3").map_err(|e| Error::Input(e.to_string()))).unwrap();
        assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
        assert_eq!(std::fs::read_to_string(out.join("config.json")).unwrap(), "3");
        assert_eq!(listing(&out), vec!["README.md", "ckpt-000004.safetensors", "config.json", "notes", "vocab.gguf"]);
        assert_eq!(listing(&d), vec!["ckpt", "link"]);
    }
    std::fs::remove_dir_all(&d).unwrap();
}

/// An existing output directory is written in place, never replaced as a directory (issue
/// 15 trial: rebuilding it lost files other processes wrote meanwhile, its setgid mode and
/// the mounts inside it): same inode and mode afterwards, foreign entries untouched.
#[cfg(unix)]
#[test]
fn an_existing_directory_keeps_its_inode_mode_and_foreign_entries() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let d = tmpdir();
    let out = d.join("ckpt");
    std::fs::create_dir(&out).unwrap();
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o2770)).unwrap();
    std::fs::write(out.join("config.json"), "old").unwrap();
    std::fs::write(out.join("notes.txt"), "mine").unwrap();
    let before = std::fs::metadata(&out).unwrap();
    publish_dir(&out, |t| {
        // A file another process writes into the directory while the build runs survives.
        std::fs::write(out.join("written-meanwhile"), "x").unwrap();
        std::fs::write(t.join("config.json"), "new").map_err(|e| Error::Input(e.to_string()))?;
        std::fs::write(t.join("model.safetensors"), "w").map_err(|e| Error::Input(e.to_string()))
    })
    .unwrap();
    let after = std::fs::metadata(&out).unwrap();
    assert_eq!((after.ino(), after.mode() & 0o7777), (before.ino(), 0o2770));
    assert_eq!(listing(&out), vec!["config.json", "model.safetensors", "notes.txt", "written-meanwhile"]);
    assert_eq!(std::fs::read_to_string(out.join("config.json")).unwrap(), "new");
    // A directory without a checkpoint (so no --force was needed): a user's file with the
    // name of one the build writes is refused, not replaced.
    let plain = d.join("plain");
    std::fs::create_dir(&plain).unwrap();
    std::fs::write(plain.join("training.json"), "mine").unwrap();
    let e = publish_dir(&plain, |t| {
        std::fs::write(t.join("config.json"), "c").map_err(|e| Error::Input(e.to_string()))?;
        std::fs::write(t.join("training.json"), "t").map_err(|e| Error::Input(e.to_string()))
    })
    .unwrap_err()
    .to_string();
    assert!(e.contains("training.json") && e.contains("refusing to replace"), "{e}");
    assert_eq!(listing(&plain), vec!["training.json"]);
    assert_eq!(std::fs::read_to_string(plain.join("training.json")).unwrap(), "mine");
    std::fs::remove_dir_all(&d).unwrap();
}

/// A safetensors file gets the mode of a plain file create (the umask's), not the 0600 of
/// the `safetensors` crate's temporary file; a replaced file keeps its mode.
#[cfg(unix)]
#[test]
fn safetensors_files_get_the_mode_of_a_plain_create() {
    use std::os::unix::fs::PermissionsExt;
    let d = tmpdir();
    let plain = d.join("plain");
    std::fs::write(&plain, "").unwrap();
    let want = std::fs::metadata(&plain).unwrap().permissions().mode() & 0o777;
    let data = [0u8; 8];
    let view = || vec![("w", safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![2], &data).unwrap())];
    let st = d.join("m.safetensors");
    write_safetensors(&st, &st, view(), None).unwrap();
    assert_eq!(std::fs::metadata(&st).unwrap().permissions().mode() & 0o777, want);
    let bytes = std::fs::read(&st).unwrap();
    assert_eq!(safetensors::SafeTensors::deserialize(&bytes).unwrap().tensor("w").unwrap().data(), &data[..]);
    std::fs::set_permissions(&st, std::fs::Permissions::from_mode(0o640)).unwrap();
    write_safetensors(&st, &st, view(), None).unwrap();
    assert_eq!(std::fs::metadata(&st).unwrap().permissions().mode() & 0o777, 0o640);
    assert_eq!(listing(&d), vec!["m.safetensors", "plain"]);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn cache_entry_recovers_and_survives_races() {
    let d = tmpdir();
    let e = d.join("entry");
    let complete = |p: &Path| p.join("config.json").is_file() && p.join("model.safetensors").is_file();
    let build = |t: &Path| {
        std::fs::write(t.join("model.safetensors"), "w").map_err(|e| Error::Input(e.to_string()))?;
        std::fs::write(t.join("config.json"), "c").map_err(|e| Error::Input(e.to_string()))
    };
    // A half-written entry from an interrupted run.
    std::fs::create_dir_all(&e).unwrap();
    std::fs::write(e.join("config.json"), "c").unwrap();
    assert!(ensure_cached_dir(&e, complete, build).unwrap());
    assert!(complete(&e));
    assert!(!ensure_cached_dir(&e, complete, build).unwrap());
    // Losing the race: the entry appears while we build.
    std::fs::remove_dir_all(&e).unwrap();
    let built = ensure_cached_dir(&e, complete, |t| {
        std::fs::create_dir_all(&e).unwrap();
        build(&e)?;
        build(t)
    })
    .unwrap();
    assert!(!built);
    assert!(complete(&e));
    assert_eq!(listing(&d), vec!["entry"]);
    // Many threads at once.
    std::fs::remove_dir_all(&e).unwrap();
    std::thread::scope(|s| {
        for _ in 0..8 {
            s.spawn(|| ensure_cached_dir(&e, complete, build).unwrap());
        }
    });
    assert!(complete(&e));
    assert_eq!(listing(&d), vec!["entry"]);
    std::fs::remove_dir_all(&d).unwrap();
}
