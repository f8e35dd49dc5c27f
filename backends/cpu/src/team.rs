//! The fork-join team that runs the CPU backend's parallel ops: the calling thread plus
//! `threads − 1` helper threads that stay awake between the ops of a forward (and park once
//! the process has been idle for [`SPIN`]).
//!
//! A decode step is ~150 short parallel ops (a matmul of one layer takes 3–30 µs on two
//! threads), separated by serial work: norms, RoPE, the activations' quantization. Run through
//! rayon, the second worker went to sleep in those gaps and every op paid a futex wake-up: on a
//! 2-vCPU VM, `perf` of a 1 + 8 verify put 11 % of the calling thread's time in the wake-up
//! (`try_to_wake_up`), and the late-starting worker ran only a third of the matmul tasks. The
//! team's helpers wait for the next op by polling an atomic counter, yielding the CPU between
//! polls (a pure `pause` spin measured the same here, and a yield leaves the core to whatever
//! else must run: llama.cpp's spinning threads collapse when a third process competes); after
//! [`SPIN`] without work they park, so an idle process burns no CPU.
//!
//! An op is tasks `0..n`. Thread `w` of `T` owns the contiguous range `w·n/T .. (w+1)·n/T` and
//! runs it in order, then takes what is left of the others' ranges, so each thread streams one
//! contiguous stretch of a matmul's weights (claiming tasks one by one from a shared counter
//! interleaved the threads' stretches and made the memory-bound 1-row step slower than
//! rayon). Which thread runs a task never changes a result: every op's tasks compute disjoint
//! outputs, each in a fixed order (the row invariance the exactness tests rest on). An op uses
//! as many threads as rayon's current pool (`--threads`, or a test's `ThreadPool::install`);
//! helpers are spawned on demand and kept (those beyond an op's count sit it out). When the
//! team is busy (another thread's op, or an op called from inside a team task), or no helper
//! could be spawned, the op runs on rayon instead: the same tasks, so the same bits.
//!
//! Measured against rayon, `ar` and batch decoding, in BENCHMARKS §29.

use rayon::prelude::*;
use std::cell::Cell;
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Condvar, Mutex, OnceLock, TryLockError};
use std::time::{Duration, Instant};

/// How long after its last task a helper polls for the next op before it parks (a decode
/// step's host work between forwards — tree building, sampling, printing — takes well under
/// this).
pub const SPIN: Duration = Duration::from_millis(4);

/// Most helper threads the team spawns.
const MAX_HELPERS: usize = 255;

/// One op: tasks `0..n` of `f`. Thread `w` (the caller 0, helper `h` = `h + 1`) owns the
/// contiguous range `w·n/T .. (w+1)·n/T` and claims its tasks in order through `next[w]`, so
/// each thread streams one contiguous stretch of the weights; a thread done with its own range
/// claims tasks of the others.
struct Job {
    /// The op's task body, its lifetime erased: the caller keeps it alive until no helper is
    /// inside the job ([`Team::inside`] is zero after the job is withdrawn).
    f: *const (dyn Fn(usize) + Sync),
    /// Helpers `0..helpers` take part.
    helpers: usize,
    /// Per thread: the next task of its range, and the range's end.
    next: Vec<(AtomicUsize, usize)>,
    done: AtomicUsize,
    /// The first task panic's payload, re-raised by the caller.
    panic: Mutex<Option<Box<dyn std::any::Any + Send>>>,
}

impl Job {
    fn new(f: *const (dyn Fn(usize) + Sync), n: usize, helpers: usize) -> Job {
        let t = helpers + 1;
        let next = (0..t).map(|w| (AtomicUsize::new(w * n / t), (w + 1) * n / t)).collect();
        Job { f, helpers, next, done: AtomicUsize::new(0), panic: Mutex::new(None) }
    }

    /// Claim and run tasks until none is left: thread `w`'s own range first, then the others'.
    fn work(&self, w: usize) {
        let t = self.next.len();
        for r in 0..t {
            let (next, end) = &self.next[(w + r) % t];
            loop {
                let i = next.fetch_add(1, SeqCst);
                if i >= *end {
                    break;
                }
                // SAFETY: `f` is alive while the job is published or a helper is inside it.
                let f = unsafe { &*self.f };
                if let Err(payload) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(i))) {
                    self.panic.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(payload);
                }
                self.done.fetch_add(1, SeqCst);
            }
        }
    }
}

struct Team {
    /// Held by the thread whose op the team runs.
    busy: Mutex<()>,
    /// The published job, or null.
    current: AtomicPtr<Job>,
    /// Bumped at every publication: what helpers wait on.
    epoch: AtomicU64,
    /// Helpers between taking the job pointer and letting go of it.
    inside: AtomicUsize,
    /// Helpers parked on `wake`.
    sleeping: AtomicUsize,
    park: Mutex<()>,
    wake: Condvar,
    spawned: Mutex<usize>,
}

static TEAM: OnceLock<Team> = OnceLock::new();

thread_local! {
    /// Set on the team's threads while they run a job's tasks: a nested op goes to rayon.
    static IN_TEAM: Cell<bool> = const { Cell::new(false) };
}

impl Team {
    fn get() -> &'static Team {
        TEAM.get_or_init(|| Team {
            busy: Mutex::new(()),
            current: AtomicPtr::new(std::ptr::null_mut()),
            epoch: AtomicU64::new(0),
            inside: AtomicUsize::new(0),
            sleeping: AtomicUsize::new(0),
            park: Mutex::new(()),
            wake: Condvar::new(),
            spawned: Mutex::new(0),
        })
    }

    /// Spawn helpers until there are `k`; returns how many exist (fewer if spawning failed).
    fn ensure_helpers(&'static self, k: usize) -> usize {
        let mut spawned = self.spawned.lock().unwrap_or_else(|e| e.into_inner());
        while *spawned < k.min(MAX_HELPERS) {
            let idx = *spawned;
            let ok = std::thread::Builder::new().name(format!("sparkling-cpu-{}", idx + 1)).spawn(move || self.helper(idx)).is_ok();
            if !ok {
                break;
            }
            *spawned += 1;
        }
        *spawned
    }

    /// A helper's life: wait for a new epoch (poll with yields, then park), work on the job
    /// if it takes part, repeat.
    fn helper(&'static self, idx: usize) {
        IN_TEAM.with(|c| c.set(true));
        let mut seen = self.epoch.load(SeqCst);
        let mut last_work = Instant::now();
        loop {
            let mut spins = 0u32;
            let e = loop {
                let e = self.epoch.load(SeqCst);
                if e != seen {
                    break e;
                }
                spins = spins.wrapping_add(1);
                if spins.is_multiple_of(256) && last_work.elapsed() > SPIN {
                    let mut g = self.park.lock().unwrap_or_else(|e| e.into_inner());
                    self.sleeping.fetch_add(1, SeqCst);
                    while self.epoch.load(SeqCst) == seen {
                        g = self.wake.wait(g).unwrap_or_else(|e| e.into_inner());
                    }
                    self.sleeping.fetch_sub(1, SeqCst);
                    drop(g);
                    // `last_work` stays: a helper woken for an op it sits out parks again.
                }
                std::thread::yield_now();
            };
            seen = e;
            self.inside.fetch_add(1, SeqCst);
            let p = self.current.load(SeqCst);
            if !p.is_null() {
                // SAFETY: a non-null `current` read while `inside` counts this helper is alive:
                // the caller withdraws it (null) and then waits for `inside` to reach zero
                // before the job leaves its stack (`Publication::drop`).
                let job = unsafe { &*p };
                if idx < job.helpers {
                    job.work(idx + 1);
                    last_work = Instant::now();
                }
            }
            self.inside.fetch_sub(1, SeqCst);
        }
    }
}

/// Withdraws the published job and waits until no helper is inside it (also when the caller's
/// own tasks panic), so the job and the closure it points to outlive every use.
struct Publication<'a>(&'a Team);

impl Drop for Publication<'_> {
    fn drop(&mut self) {
        self.0.current.store(std::ptr::null_mut(), SeqCst);
        let mut spins = 0u32;
        while self.0.inside.load(SeqCst) != 0 {
            spins = spins.wrapping_add(1);
            // A helper preempted inside the job (a busy machine): let it run.
            if spins.is_multiple_of(4096) {
                std::thread::yield_now();
            }
            std::hint::spin_loop();
        }
    }
}

/// Threads an op may use: rayon's current pool size (`--threads`, or a test's pool).
pub fn threads() -> usize {
    rayon::current_num_threads().max(1)
}

/// Run `f(0)`, …, `f(n − 1)`, each once, spread over [`threads`] threads; returns when all are
/// done. Tasks must not depend on which thread runs them or in which order (every caller's
/// tasks write disjoint outputs). The first task panic is re-raised here (its payload, as
/// rayon does) after every task ended.
pub fn for_each<F: Fn(usize) + Sync>(n: usize, f: F) {
    let t = threads();
    if n <= 1 || t == 1 {
        (0..n).for_each(f);
        return;
    }
    if IN_TEAM.with(|c| c.get()) {
        (0..n).into_par_iter().for_each(&f);
        return;
    }
    let team = Team::get();
    let _busy = match team.busy.try_lock() {
        Ok(g) => g,
        Err(TryLockError::Poisoned(e)) => e.into_inner(),
        Err(TryLockError::WouldBlock) => {
            (0..n).into_par_iter().for_each(&f);
            return;
        }
    };
    let helpers = team.ensure_helpers(t - 1).min(t - 1);
    if helpers == 0 {
        (0..n).into_par_iter().for_each(&f);
        return;
    }
    let body: &(dyn Fn(usize) + Sync) = &f;
    // SAFETY: only the lifetime is erased; `Publication` keeps `f` in use no longer than here.
    let body: *const (dyn Fn(usize) + Sync + 'static) = unsafe { std::mem::transmute(body) };
    let job = Job::new(body, n, helpers);
    team.current.store(&job as *const Job as *mut Job, SeqCst);
    let publication = Publication(team);
    team.epoch.fetch_add(1, SeqCst);
    if team.sleeping.load(SeqCst) > 0 {
        let _g = team.park.lock().unwrap_or_else(|e| e.into_inner());
        team.wake.notify_all();
    }
    IN_TEAM.with(|c| c.set(true));
    job.work(0);
    IN_TEAM.with(|c| c.set(false));
    let mut spins = 0u32;
    while job.done.load(SeqCst) < n {
        spins = spins.wrapping_add(1);
        // A helper descheduled mid-task (a busy machine): let it run.
        if spins.is_multiple_of(4096) {
            std::thread::yield_now();
        }
        std::hint::spin_loop();
    }
    drop(publication);
    let payload = job.panic.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(payload) = payload {
        std::panic::resume_unwind(payload);
    }
}

/// `(0..n).map(f)` computed with [`for_each`], in index order.
pub fn map<T: Send, F: Fn(usize) -> T + Sync>(n: usize, f: F) -> Vec<T> {
    let mut out: Vec<Option<T>> = (0..n).map(|_| None).collect();
    let slots = Shared::new(&mut out);
    for_each(n, |i| {
        let v = f(i);
        // SAFETY: task `i` alone writes slot `i` of `out`, which outlives `for_each`.
        unsafe { *slots.get().add(i) = Some(v) };
    });
    out.into_iter().map(|v| v.expect("for_each ran every task")).collect()
}

/// `chunks_mut(size)` of `data`, chunk `i` handed to `f(i, chunk)` with [`for_each`] (a `size`
/// of 0 is taken as 1).
pub fn for_each_chunk<T: Send, F: Fn(usize, &mut [T]) + Sync>(data: &mut [T], size: usize, f: F) {
    let size = size.max(1);
    let (len, base) = (data.len(), Shared::new(data));
    for_each(len.div_ceil(size), |i| {
        let start = i * size;
        // SAFETY: chunks of distinct tasks are disjoint parts of `data`, which is borrowed
        // mutably for the whole call.
        f(i, unsafe { base.slice(start, size.min(len - start)) });
    });
}

/// A buffer handed to the tasks of one op, each of which writes its own disjoint part of it
/// (through [`Shared::slice`] or [`Shared::get`]); the buffer stays mutably borrowed while the
/// handle lives. Reads of one element by several tasks would need `T: Sync`: no user does that.
pub struct Shared<'a, T> {
    ptr: *mut T,
    len: usize,
    _buf: std::marker::PhantomData<&'a mut [T]>,
}

// SAFETY: tasks only touch disjoint elements through it (each user's safety argument), which
// is what handing `&mut` parts of a `T: Send` buffer to other threads requires.
unsafe impl<T: Send> Send for Shared<'_, T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for Shared<'_, T> {}

impl<'a, T> Shared<'a, T> {
    /// A handle on `buf` for the tasks of one op.
    pub fn new(buf: &'a mut [T]) -> Shared<'a, T> {
        Shared { ptr: buf.as_mut_ptr(), len: buf.len(), _buf: std::marker::PhantomData }
    }

    /// The buffer's base pointer (a method, so closures capture the `Sync` handle, not the raw
    /// field).
    pub fn get(&self) -> *mut T {
        self.ptr
    }

    /// Elements `start..start + len` of the buffer. Panics when the range is outside it.
    ///
    /// # Safety
    /// No other task touches the range while the returned slice lives.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice(&self, start: usize, len: usize) -> &mut [T] {
        assert!(start.checked_add(len).is_some_and(|end| end <= self.len), "Shared::slice: {start}+{len} outside a buffer of {}", self.len);
        std::slice::from_raw_parts_mut(self.ptr.add(start), len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_task_runs_once_on_any_pool() {
        for threads in [1, 2, 3] {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            pool.install(|| {
                for n in [0usize, 1, 2, 7, 64, 1000] {
                    let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                    for_each(n, |i| {
                        hits[i].fetch_add(1, SeqCst);
                    });
                    assert!(hits.iter().all(|h| h.load(SeqCst) == 1), "{threads} threads, {n} tasks");
                    assert_eq!(map(n, |i| i * i), (0..n).map(|i| i * i).collect::<Vec<_>>());
                }
            });
        }
    }

    #[test]
    fn chunks_cover_the_slice_and_nested_or_concurrent_ops_fall_back() {
        let mut v = vec![0usize; 1003];
        for_each_chunk(&mut v, 10, |i, c| c.iter_mut().enumerate().for_each(|(j, x)| *x = i * 10 + j));
        assert_eq!(v, (0..1003).collect::<Vec<_>>());
        // Ops from several threads at once, each with nested ops inside its tasks.
        std::thread::scope(|s| {
            for k in 0..4usize {
                s.spawn(move || {
                    for _ in 0..50 {
                        let got = map(9, |i| map(5, |j| i * j + k).iter().sum::<usize>());
                        assert_eq!(got, (0..9).map(|i| 10 * i + 5 * k).collect::<Vec<_>>());
                    }
                });
            }
        });
    }

    #[test]
    fn a_panicking_task_panics_the_op_and_the_team_still_works() {
        for threads in [2, 3] {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            let r = pool.install(|| std::panic::catch_unwind(|| for_each(16, |i| assert!(i != 11, "task 11 fails"))));
            // The task's own payload comes back, as from rayon.
            let payload = r.expect_err("the op must panic");
            let msg = payload.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| payload.downcast_ref::<String>().cloned());
            assert_eq!(msg.as_deref(), Some("task 11 fails"), "{threads} threads");
        }
        assert_eq!(map(16, |i| i + 1), (1..=16).collect::<Vec<_>>());
    }
}
