//! What keeps a run's work safe, checked before step one: `--out` and `--plot` are writable and
//! the disk holds a snapshot; `--out` is this run's alone (a lock file naming the holder's pid,
//! and no other run's snapshots unless `--resume` names them or `--overwrite` is given); and a
//! SIGTERM or Ctrl-C ends the run after the current step with a snapshot, a second one at once.
//!
//! Example: `let _lock = guard::check_outputs(&args, snapshot_bytes)?;` then
//! `if guard::stop_requested() { ... }` after each step.

use super::Args;
use anyhow::{bail, Context};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// The lock file in `--out`: the holder's pid, removed when the run ends.
pub const LOCK_FILE: &str = "frugal.lock";

/// Set by the first SIGTERM/SIGINT; a second one exits at once (status 130).
static STOP: AtomicBool = AtomicBool::new(false);

/// Installs the handlers: the first SIGTERM or SIGINT asks the loop to stop after its step, the
/// second exits the process at once.
pub fn install_signal_handlers() -> anyhow::Result<()> {
    for signal in [libc::SIGTERM, libc::SIGINT] {
        // The shutdown goes first: armed only once the flag is set by the first signal.
        signal_hook::flag::register_conditional_shutdown(signal, 130, &STOP)
            .and_then(|_| signal_hook::flag::register(signal, &STOP))
            .context("installing the SIGTERM/SIGINT handlers")?;
    }
    Ok(())
}

/// Whether a stop was asked for (this rank's view; ranks agree with `Trainer::any_rank`).
pub fn stop_requested() -> bool {
    STOP.load(Ordering::SeqCst)
}

/// `--out`'s lock, released (file removed) when dropped.
pub struct Lock {
    path: PathBuf,
}

impl Drop for Lock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Checks, before any data is read: `--out` can be created and written, holds no other run's
/// snapshots (unless resumed from or `--overwrite`), has room for `snapshot_bytes` when snapshots
/// are asked for, and is not in use by a running frugal (taking its lock); `--plot` can be
/// written.
pub fn check_outputs(
    args: &Args,
    snapshot_bytes: u64,
    model_bytes: u64,
) -> anyhow::Result<Option<Lock>> {
    if let Some(plot) = &args.plot {
        check_writable_file(plot).with_context(|| format!("--plot {}", plot.display()))?;
    }
    let Some(out) = &args.out else {
        return Ok(None);
    };
    let flag = || format!("--out {}", out.display());
    std::fs::create_dir_all(out).with_context(|| format!("{}: creating the folder", flag()))?;
    let lock = take_lock(out).with_context(flag)?;
    check_writable_file(&out.join(".frugal-write-check")).with_context(flag)?;
    check_foreign_snapshots(args, out)?;
    // The final model (f32 safetensors) must fit too, snapshots or not.
    if let Some(free) = free_bytes(out) {
        if free < model_bytes {
            bail!(
                "{}: the trained model needs {} but the disk has {} free; free space, or write \
                 it elsewhere",
                flag(),
                term::human_bytes(model_bytes),
                term::human_bytes(free)
            );
        }
    }
    if args.save_every.is_some() {
        if let Some(free) = free_bytes(out) {
            if free < snapshot_bytes {
                bail!(
                    "{}: a snapshot needs {} but the disk has {} free; free space, or write \
                     snapshots elsewhere",
                    flag(),
                    term::human_bytes(snapshot_bytes),
                    term::human_bytes(free)
                );
            }
        }
    }
    // The step of a finished model this run will replace no longer describes the folder.
    let step_file = out.join(train::snapshot::finished::STEP_FILE);
    if step_file.exists() {
        std::fs::remove_file(&step_file)
            .with_context(|| format!("{}: removing {}", flag(), step_file.display()))?;
    }
    Ok(Some(lock))
}

/// Creates (or opens) `path` for writing; a file that was not there before is removed again.
fn check_writable_file(path: &Path) -> anyhow::Result<()> {
    let existed = path.exists();
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    if !existed {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

/// Takes `out/frugal.lock` (created exclusively, holding this pid); a lock whose pid is no
/// longer running is stale and taken over.
fn take_lock(out: &Path) -> anyhow::Result<Lock> {
    let path = out.join(LOCK_FILE);
    for _ in 0..2 {
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
        {
            Ok(mut file) => {
                writeln!(file, "{}", std::process::id())
                    .with_context(|| format!("writing {}", path.display()))?;
                return Ok(Lock { path });
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                match text.trim().parse::<u32>() {
                    Ok(pid) if process_alive(pid) => bail!(
                        "another frugal run (pid {pid}) is writing to this folder; wait for it, \
                         stop it, or use another --out"
                    ),
                    // Stale: its run died without removing it.
                    _ => {
                        let _ = std::fs::remove_file(&path);
                    }
                }
            }
            Err(e) => return Err(e).with_context(|| format!("creating {}", path.display())),
        }
    }
    bail!("could not take the lock {}", path.display())
}

fn process_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Refuses an `--out` holding committed snapshots of another run (one `--resume` does not name:
/// the folder or one of its snapshots): a new run's snapshots would be pruned in favour of the
/// older run's higher step numbers.
fn check_foreign_snapshots(args: &Args, out: &Path) -> anyhow::Result<()> {
    if args.overwrite {
        return Ok(());
    }
    let committed = train::snapshot::files::committed(out).unwrap_or_default();
    let Some((step, _)) = committed.last() else {
        // A finished model with no snapshots beside it is replaced only when asked.
        let saved = ["model.safetensors", "adapter_model.safetensors"]
            .iter()
            .find(|f| out.join(f).is_file());
        if let Some(file) = saved {
            bail!(
                "--out {} holds a saved model ({file}): pass --overwrite to replace it, or use \
                 another --out",
                out.display()
            );
        }
        return Ok(());
    };
    // Resuming from this folder (or one of its snapshots) continues that run.
    let canonical = |p: &Path| std::fs::canonicalize(p).ok();
    let here = canonical(out);
    let continues = args
        .resume
        .as_deref()
        .and_then(canonical)
        .is_some_and(|r| Some(r.clone()) == here || r.parent().map(Path::to_path_buf) == here);
    if continues {
        return Ok(());
    }
    bail!(
        "--out {} holds another run's snapshots (newest at step {step}): continue it with \
         --resume {}, pass --overwrite to start a new run there (its snapshots are deleted), or \
         use another --out",
        out.display(),
        out.display()
    )
}

/// Deletes every committed snapshot in `out` (`--overwrite`).
pub fn remove_snapshots(out: &Path) -> anyhow::Result<()> {
    for (_, dir) in train::snapshot::files::committed(out).unwrap_or_default() {
        std::fs::remove_dir_all(&dir)
            .with_context(|| format!("--overwrite: removing {}", dir.display()))?;
    }
    Ok(())
}

/// Free bytes on the file system holding `dir` (for unprivileged users), when known.
fn free_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is a NUL-terminated string and `stat` a valid out-parameter.
    let rc = unsafe { libc::statvfs(path.as_ptr(), &mut stat) };
    (rc == 0).then(|| (stat.f_bavail as u64).saturating_mul(stat.f_frsize as u64))
}
