//! Safe file output: no file the engine writes is ever half-written or silently
//! replaced. Every file goes to a temporary sibling (same directory, so the final rename never
//! crosses a file system) that is synced and renamed over the destination only when complete; a
//! failure or a panic removes the temporary. Checkpoint directories are built the same way, and
//! a shared cache entry is published with one directory rename, so concurrent first users and
//! interrupted runs cannot leave a broken entry behind.

use crate::error::{Error, Result};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Write `s` to stdout and flush. A closed pipe (`sparkling … | head`) ends the program quietly
/// with status 0: the reader has what it wanted, and results meant for files were written
/// before stdout was touched. Other errors (`> /dev/full`) are returned, naming stdout.
pub fn write_stdout(s: &str) -> Result<()> {
    use std::io::Write;
    let mut o = std::io::stdout().lock();
    o.write_all(s.as_bytes()).and_then(|_| o.flush()).map_err(stdout_error)
}

/// The error for a failed write to stdout; a broken pipe exits quietly instead (see
/// [`write_stdout`]).
pub fn stdout_error(e: std::io::Error) -> Error {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        std::process::exit(0);
    }
    Error::Input(format!("cannot write to standard output: {e}"))
}

/// Files whose presence marks a directory as holding a checkpoint or model.
pub fn holds_model(dir: &Path) -> bool {
    let Ok(rd) = std::fs::read_dir(dir) else { return false };
    rd.filter_map(|e| e.ok()).any(|e| {
        let n = e.file_name();
        let n = n.to_string_lossy();
        is_checkpoint_file(&n)
    })
}

/// Refuse to write a checkpoint into `dir` (named by the argument `arg`, e.g. `--out`) when it
/// already holds one (a `config.json`, `*.safetensors` or `*.gguf`) unless `force`, and when it
/// exists but is not a directory. Call before any expensive work.
pub fn check_out_dir(dir: &Path, force: bool, arg: &str) -> Result<()> {
    if dir.exists() && !dir.is_dir() {
        return Err(Error::file(dir, format!("{arg}: exists and is not a directory")));
    }
    if !force && holds_model(dir) {
        return Err(Error::file(
            dir,
            format!("{arg}: this directory already holds a checkpoint or model (config.json, *.safetensors or *.gguf); pass --force to replace its files"),
        ));
    }
    Ok(())
}

/// A path in the same directory as `path`, hidden and unique to this process and call.
fn sibling(path: &Path, tag: &str) -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    #[cfg(not(target_arch = "wasm32"))]
    let pid = std::process::id();
    #[cfg(target_arch = "wasm32")]
    let pid = 0u32;
    let name = path.file_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "out".into());
    let n = N.fetch_add(1, Ordering::Relaxed);
    path.with_file_name(format!(".{name}.{tag}-{pid}-{n}"))
}

/// Remove the temporaries of `path` (see [`sibling`]) left by processes that no longer run (a
/// killed run cannot clean up after itself). Linux only (process liveness from `/proc`);
/// elsewhere a stale temporary stays, hidden, and is harmless.
fn sweep_stale(path: &Path) {
    #[cfg(target_os = "linux")]
    {
        let Some(name) = path.file_name().map(|s| s.to_string_lossy().into_owned()) else { return };
        let prefix = format!(".{name}.");
        let Ok(rd) = std::fs::read_dir(parent_of(path)) else { return };
        for e in rd.filter_map(|e| e.ok()) {
            let f = e.file_name().to_string_lossy().into_owned();
            let Some(rest) = f.strip_prefix(&prefix) else { continue };
            // `{tag}-{pid}-{n}` with a tag of ours.
            let mut it = rest.splitn(3, '-');
            let (Some(tag), Some(pid), Some(_)) = (it.next(), it.next(), it.next()) else { continue };
            let Ok(pid) = pid.parse::<u32>() else { continue };
            if !["tmp", "probe", "broken"].contains(&tag) || pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists() {
                continue;
            }
            let p = e.path();
            let _ = if p.is_dir() { std::fs::remove_dir_all(&p) } else { std::fs::remove_file(&p) };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = path;
}

/// A temporary file or directory removed on drop unless kept. While it lives its path is in
/// [`LIVE`], so an interrupt removes it too ([`install_interrupt_cleanup`]).
struct Temp {
    path: PathBuf,
    keep: bool,
}

/// The temporaries of this process that exist now (see [`Temp`]).
static LIVE: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());

impl Temp {
    fn new(path: PathBuf) -> Temp {
        if let Ok(mut l) = LIVE.lock() {
            l.push(path.clone());
        }
        Temp { path, keep: false }
    }

    /// Rename this temporary to `dest` as one step an interrupt cannot split (see
    /// [`exclusive`]); on success it is no longer a temporary (kept, unlisted).
    fn publish_to(&mut self, dest: &Path) -> std::io::Result<()> {
        exclusive(|live| {
            std::fs::rename(&self.path, dest)?;
            self.keep = true;
            if let Some(i) = live.iter().rposition(|p| *p == self.path) {
                live.swap_remove(i);
            }
            Ok(())
        })
    }
}

/// Run `f` with the list of live temporaries locked, so an interrupt's cleanup
/// ([`install_interrupt_cleanup`]) happens entirely before or entirely after it: a rename that
/// publishes a temporary is never interleaved with the removal of that temporary (a fifth
/// trial saw a `config.json` published without its weights).
fn exclusive<T>(f: impl FnOnce(&mut Vec<PathBuf>) -> T) -> T {
    let mut l = LIVE.lock().unwrap_or_else(|p| p.into_inner());
    f(&mut l)
}

fn remove_path(p: &Path) {
    if p.is_dir() {
        let _ = std::fs::remove_dir_all(p);
    } else {
        let _ = std::fs::remove_file(p);
    }
}

impl Drop for Temp {
    fn drop(&mut self) {
        if !self.keep {
            remove_path(&self.path);
        }
        if let Ok(mut l) = LIVE.lock() {
            if let Some(i) = l.iter().rposition(|p| *p == self.path) {
                l.swap_remove(i);
            }
        }
    }
}

/// On SIGINT, SIGTERM or SIGHUP, remove this process's half-written temporaries (files and
/// directories being built, see [`write_with`] and [`publish_dir`]) and exit with status 130, so
/// an interrupted run leaves no hidden multi-gigabyte leftovers. A run killed with
/// SIGKILL cannot clean up: its temporaries are swept by the next run writing the same output.
/// Call once at start-up; a second call (or a host that already handles these signals) is a
/// no-op. A program that shuts down on its own terms (a server draining its requests) sets
/// [`on_interrupt`] instead: the signal then calls that hook, and a second signal exits as above.
/// Native only.
#[cfg(not(target_arch = "wasm32"))]
pub fn install_interrupt_cleanup() {
    let _ = ctrlc::set_handler(|| {
        let hook = INTERRUPT_HOOK.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(h) = hook {
            h();
            return;
        }
        // The lock is held until the process exits: no publishing rename can start meanwhile.
        // The main thread may still be writing into a temporary directory (a file it creates
        // after a removal pass makes that directory's removal fail), so the removal repeats
        // until two passes in a row find nothing left, for at most about a second.
        let live = LIVE.lock().unwrap_or_else(|p| p.into_inner());
        let mut clean = 0;
        for _ in 0..50 {
            let left = live.iter().filter(|p| std::fs::symlink_metadata(p).is_ok()).count();
            clean = if left == 0 { clean + 1 } else { 0 };
            if clean == 2 {
                break;
            }
            live.iter().for_each(|p| remove_path(p));
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        std::process::exit(130);
    });
}

/// What the next SIGINT / SIGTERM / SIGHUP does instead of cleaning up and exiting (once).
#[cfg(not(target_arch = "wasm32"))]
static INTERRUPT_HOOK: std::sync::Mutex<Option<Box<dyn FnOnce() + Send>>> = std::sync::Mutex::new(None);

/// Let the next interrupt signal call `hook` instead of ending the process (see
/// [`install_interrupt_cleanup`]); a later signal ends it as usual. Native only.
#[cfg(not(target_arch = "wasm32"))]
pub fn on_interrupt(hook: Box<dyn FnOnce() + Send>) {
    *INTERRUPT_HOOK.lock().unwrap_or_else(|p| p.into_inner()) = Some(hook);
}

fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Write `path` atomically: `fill` writes the temporary file it is given (in the same
/// directory); when it returns `Ok` the file is synced and renamed over `path`. On an error or
/// a panic in `fill`, `path` is untouched and the temporary is removed. The parent directory
/// must exist.
///
/// What is already at `path` decides how: a symbolic link is followed and its target written
/// atomically (the link stays a link); a device, FIFO or socket (`/dev/stdout`, a named pipe)
/// is written through in place, never replaced by a regular file; an existing model file
/// (`*.gguf`, `*.safetensors`, or any file starting with the GGUF magic) is never replaced —
/// an error names it.
pub fn write_with(path: &Path, fill: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    if is_stdout(path) {
        // `/dev/stdout` resolves to whatever fd 1 is (a pipe, or a file the shell opened with
        // `>>`): reopening or renaming over it would truncate or replace that file. Write to a
        // private temporary, then copy it to this process's standard output.
        let tmp = Temp::new(std::env::temp_dir().join(sibling(path, "tmp").file_name().unwrap_or_default()));
        fill(&tmp.path)?;
        let bytes = std::fs::read(&tmp.path).map_err(|e| Error::file(path, format!("cannot write: {e}")))?;
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        return out.write_all(&bytes).and_then(|_| out.flush()).map_err(|e| Error::file(path, format!("cannot write: {e}")));
    }
    if path.is_dir() {
        return Err(Error::file(path, "is a directory, expected a file path"));
    }
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if meta.file_type().is_symlink() {
            let target = std::fs::canonicalize(path).map_err(|e| Error::file(path, format!("is a symbolic link whose target cannot be resolved: {e}")))?;
            return write_with(&target, fill);
        }
        if !meta.file_type().is_file() {
            // A device or pipe: write through it (no temporary, no rename over it).
            return fill(path);
        }
        if is_model_file(path) {
            return Err(Error::file(path, "holds a model (GGUF or safetensors); refusing to replace it with this output — choose another file name"));
        }
    }
    let parent = parent_of(path);
    if !parent.is_dir() {
        return Err(Error::file(path, format!("cannot write: directory {} does not exist", parent.display())));
    }
    sweep_stale(path);
    let mut tmp = Temp::new(sibling(path, "tmp"));
    fill(&tmp.path)?;
    if let Ok(f) = std::fs::File::open(&tmp.path) {
        let _ = f.sync_all();
    }
    tmp.publish_to(path).map_err(|e| Error::file(path, format!("cannot write (rename of the completed temporary file failed): {e}")))?;
    Ok(())
}

/// Whether `path` names this process's standard output (`/dev/stdout`, `/dev/fd/1`,
/// `/proc/self/fd/1`), which [`write_with`] writes through the stdout handle.
fn is_stdout(path: &Path) -> bool {
    cfg!(unix) && [Path::new("/dev/stdout"), Path::new("/dev/fd/1"), Path::new("/proc/self/fd/1")].contains(&path)
}

/// Whether the existing regular file `path` is a model: a `.gguf` / `.safetensors` name, the
/// GGUF magic in its first four bytes, or the `config.json` / `model.safetensors.index.json`
/// of a directory that holds weights.
fn is_model_file(path: &Path) -> bool {
    let ext = path.extension().map(|e| e.to_string_lossy().to_ascii_lowercase());
    if matches!(ext.as_deref(), Some("gguf") | Some("safetensors")) {
        return true;
    }
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    if (name == "config.json" || name == "model.safetensors.index.json")
        && std::fs::read_dir(parent_of(path)).is_ok_and(|rd| {
            rd.filter_map(|e| e.ok()).any(|e| {
                let n = e.file_name().to_string_lossy().to_ascii_lowercase();
                n.ends_with(".safetensors") || n.ends_with(".gguf")
            })
        })
    {
        return true;
    }
    let mut magic = [0u8; 4];
    std::fs::File::open(path).and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic)).is_ok() && &magic == b"GGUF"
}

/// Whether `a` and `b` name the same existing file (after following symbolic links; on Unix
/// also two hard links of one file: the same device and inode). Used to refuse an output path
/// that is one of the run's inputs, and to run a prompt file listed twice once.
pub fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(x), Ok(y)) if x == y => true,
        #[cfg(unix)]
        (Ok(x), Ok(y)) => {
            use std::os::unix::fs::MetadataExt;
            match (std::fs::metadata(x), std::fs::metadata(y)) {
                // Regular files only: two names of one pipe or device are not "the same file"
                // for this purpose (each read consumes it).
                (Ok(m), Ok(n)) => m.is_file() && n.is_file() && m.dev() == n.dev() && m.ino() == n.ino(),
                _ => false,
            }
        }
        _ => false,
    }
}

/// Write `bytes` to `path` atomically (see [`write_with`]).
pub fn write_bytes(path: &Path, bytes: &[u8]) -> Result<()> {
    write_with(path, |tmp| std::fs::write(tmp, bytes).map_err(|e| Error::file(path, format!("cannot write: {e}"))))
}

/// Check, before expensive work, that `path` can later be written by [`write_with`]: its
/// directory exists and accepts new files, and `path` is not a directory. Creates and removes
/// a temporary sibling; `path` itself is not touched. `arg` names the argument in errors.
pub fn check_writable(path: &Path, arg: &str) -> Result<()> {
    if is_stdout(path) {
        return Ok(());
    }
    if path.is_dir() {
        return Err(Error::file(path, format!("{arg}: is a directory, expected a file path")));
    }
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if meta.file_type().is_symlink() {
            let target = std::fs::canonicalize(path).map_err(|e| Error::file(path, format!("{arg}: a symbolic link whose target cannot be resolved: {e}")))?;
            return check_writable(&target, arg);
        }
        if !meta.file_type().is_file() {
            // A device or pipe is written through in place (see `write_with`).
            return Ok(());
        }
        if is_model_file(path) {
            return Err(Error::file(
                path,
                format!("{arg}: holds a model (GGUF or safetensors); refusing to replace it with this output — choose another file name"),
            ));
        }
    }
    let t = Temp::new(sibling(path, "probe"));
    std::fs::OpenOptions::new().write(true).create_new(true).open(&t.path).map(|_| ()).map_err(|e| Error::file(path, format!("{arg}: cannot write here: {e}")))
}

fn create_temp_dir(dir: &Path, tag: &str) -> Result<Temp> {
    let parent = parent_of(dir);
    std::fs::create_dir_all(parent).map_err(|e| Error::file(parent, format!("cannot create directory: {e}")))?;
    sweep_stale(dir);
    let tmp = Temp::new(sibling(dir, tag));
    std::fs::create_dir(&tmp.path).map_err(|e| Error::file(dir, format!("cannot create a temporary directory next to it: {e}")))?;
    Ok(tmp)
}

/// Write the checkpoint directory `dir`: `build` fills a temporary directory with the new
/// files, which are then published. A new (or empty) `dir` is built beside it and renamed into
/// place in one step, so it appears whole or not at all. An existing `dir` (callers check
/// `--force` first with [`check_out_dir`]) is never replaced as a directory — its inode, mode,
/// mounts and every other entry stay — : the new files are built in a hidden temporary
/// directory inside it (same file system even when `dir` is a mount point), then each is
/// renamed over its old version (every file is replaced atomically; `config.json` last), and the
/// old files of the HF checkpoint layout that the build did not write again
/// ([`is_replaced_file`]: a stale weight shard or index) are removed, so no stale shard mixes
/// with the new files. An interrupt (SIGINT, SIGTERM, SIGHUP) waits until those renames are
/// done; a process killed with SIGKILL during them can leave new weights beside the old
/// `config.json`, and rerunning the command replaces both. When `dir` held no checkpoint as the
/// build started but holds one when it ends (another process wrote it meanwhile), nothing is
/// published and an error says so. On an error or a panic before publishing, `dir` is untouched
/// and the temporary is removed. A symbolic link `dir` is followed: the directory it names is
/// written, the link stays.
pub fn publish_dir(dir: &Path, build: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    if std::fs::symlink_metadata(dir).is_ok_and(|m| m.file_type().is_symlink()) {
        let target = std::fs::canonicalize(dir).map_err(|e| Error::file(dir, format!("is a symbolic link whose target cannot be resolved: {e}")))?;
        return publish_dir(&target, build);
    }
    if dir.exists() && !dir.is_dir() {
        return Err(Error::file(dir, "exists and is not a directory"));
    }
    let held_before = holds_model(dir);
    let raced =
        || Error::file(dir, "another process wrote a checkpoint here while this one was building it; nothing was replaced (rerun with --force to replace it)");
    let existing = std::fs::read_dir(dir).is_ok_and(|mut r| r.next().is_some());
    if !existing {
        let mut tmp = create_temp_dir(dir, "tmp")?;
        build(&tmp.path)?;
        if !held_before && holds_model(dir) {
            return Err(raced());
        }
        // Renaming over an empty directory is one atomic step; it fails if `dir` was filled
        // meanwhile (with files that are not a checkpoint): then publish file by file.
        if tmp.publish_to(dir).is_ok() {
            return Ok(());
        }
        return exclusive(|_| install_files(&tmp.path, dir));
    }
    let tmp = create_temp_dir(&dir.join("checkpoint"), "tmp")?;
    build(&tmp.path)?;
    if !held_before && holds_model(dir) {
        return Err(raced());
    }
    if !held_before {
        // No checkpoint here, so no `--force` was asked for: a file of the user's with the name
        // of one we write (a `training.json`, a `draft_vocab.json`) is not ours to replace.
        let clash = std::fs::read_dir(&tmp.path).ok().and_then(|rd| rd.filter_map(|e| e.ok()).map(|e| e.file_name()).find(|n| dir.join(n).exists()));
        if let Some(n) = clash {
            return Err(Error::file(
                &dir.join(&n),
                "exists in the output directory and is not part of a checkpoint there; refusing to replace it (move it, or choose another directory)",
            ));
        }
    }
    // All renames under the interrupt lock: an interrupt never leaves new weights beside an
    // old config.json.
    exclusive(|_| install_files(&tmp.path, dir))
}

/// Move every entry of the built directory `from` into `dir` (each rename atomic, `config.json`
/// last), then remove the files of the HF checkpoint layout in `dir` that `from` did not hold.
fn install_files(from: &Path, dir: &Path) -> Result<()> {
    let read = |d: &Path| -> Result<Vec<String>> {
        let rd = std::fs::read_dir(d).map_err(|e| Error::file(d, format!("cannot read the directory: {e}")))?;
        Ok(rd.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
    };
    let mut built = read(from)?;
    built.sort_by_key(|n| (n == "config.json", n.clone()));
    for name in &built {
        let dst = dir.join(name);
        if dst.is_dir() {
            return Err(Error::file(&dst, "is a directory: cannot replace it with the new file of the same name"));
        }
        std::fs::rename(from.join(name), &dst).map_err(|e| Error::file(&dst, format!("cannot write (rename of the completed file failed): {e}")))?;
    }
    for name in read(dir)? {
        if is_replaced_file(&name) && !built.contains(&name) {
            let p = dir.join(&name);
            std::fs::remove_file(&p).map_err(|e| Error::file(&p, format!("cannot remove the stale file of the old checkpoint: {e}")))?;
        }
    }
    Ok(())
}

/// Whether `name` is a file of a checkpoint or model (what [`holds_model`] looks for before
/// an output directory is written without `--force`): `config.json`, `*.safetensors`, `*.gguf`.
pub fn is_checkpoint_file(name: &str) -> bool {
    name == "config.json" || name.ends_with(".safetensors") || name.ends_with(".gguf")
}

/// Whether `name` is a file of the HF checkpoint layout that [`publish_dir`] replaces as a
/// whole: `config.json`, `model.safetensors`, `model.safetensors.index.json` and the shards
/// `model-NNNNN-of-NNNNN.safetensors`. Every other file survives a `--force` rewrite.
pub fn is_replaced_file(name: &str) -> bool {
    if matches!(name, "config.json" | "model.safetensors" | "model.safetensors.index.json") {
        return true;
    }
    let Some(mid) = name.strip_prefix("model-").and_then(|r| r.strip_suffix(".safetensors")) else { return false };
    let mut parts = mid.split("-of-");
    matches!((parts.next(), parts.next(), parts.next()), (Some(a), Some(b), None) if !a.is_empty() && !b.is_empty() && a.bytes().chain(b.bytes()).all(|c| c.is_ascii_digit()))
}

/// Write the safetensors file `path` from `tensors` (+ header `metadata`) atomically, streamed
/// (no in-memory copy of the file), with the mode a plain file create gives (0644 under the
/// usual umask 022), or the mode of the file it replaces. The `safetensors` crate writes a
/// temporary file and renames it over `path`, which leaves mode 0600; here a missing `path` is
/// first created the ordinary way to learn the mode, which is then given to the written file.
/// `shown` names the file in errors (the final path when `path` is inside a temporary
/// directory). Errors: [`Error::File`] naming `shown`, for a failed create, serialization or
/// write.
pub fn write_safetensors<S, V, I>(path: &Path, shown: &Path, tensors: I, metadata: Option<std::collections::HashMap<String, String>>) -> Result<()>
where
    S: AsRef<str> + Ord + std::fmt::Display,
    V: safetensors::View,
    I: IntoIterator<Item = (S, V)>,
{
    let mode = match std::fs::metadata(path) {
        Ok(m) => m.permissions(),
        Err(_) => std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
            .and_then(|f| f.metadata())
            .map_err(|e| Error::file(shown, format!("cannot create: {e}")))?
            .permissions(),
    };
    safetensors::serialize_to_file(tensors, metadata, path).map_err(|e| Error::file(shown, format!("cannot write safetensors: {e}")))?;
    std::fs::set_permissions(path, mode).map_err(|e| Error::file(shown, format!("cannot set the file mode: {e}")))
}

/// Make sure the shared cache entry `dir` is complete (`complete(dir)`), building it when it is
/// not. The entry is built in a temporary sibling and published with one rename, so a reader
/// never sees a half-written entry; when two first users race, the loser drops its copy and uses
/// the winner's. An incomplete entry (left by an interrupted older run) is moved aside and
/// removed, then rebuilt. Returns whether this call built the entry.
pub fn ensure_cached_dir(dir: &Path, complete: impl Fn(&Path) -> bool, build: impl FnOnce(&Path) -> Result<()>) -> Result<bool> {
    if complete(dir) {
        return Ok(false);
    }
    if dir.exists() {
        // Published entries are always complete, so this one was left by an interrupted older
        // run (or was just published by a concurrent user: check again).
        if complete(dir) {
            return Ok(false);
        }
        // Move it aside first (atomic), so a concurrent user never sees it half-deleted;
        // losing this race to another process is fine.
        let mut aside = Temp::new(sibling(dir, "broken"));
        if std::fs::rename(dir, &aside.path).is_ok() {
            if complete(&aside.path) {
                // A concurrent user published a complete entry in between: put it back.
                if aside.publish_to(dir).is_ok() {
                    return Ok(false);
                }
            } else {
                eprintln!("note: {} was incomplete (an interrupted earlier run?); rebuilding it", dir.display());
            }
        }
        drop(aside);
    }
    let mut tmp = create_temp_dir(dir, "tmp")?;
    build(&tmp.path)?;
    match tmp.publish_to(dir) {
        Ok(()) => Ok(true),
        // Another process published the entry first (rename onto a non-empty directory fails):
        // use theirs; `tmp` is removed on drop.
        Err(_) if complete(dir) => Ok(false),
        Err(e) => Err(Error::file(dir, format!("cannot publish the cache entry: {e}"))),
    }
}

#[cfg(test)]
mod tests;
