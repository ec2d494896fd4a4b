//! The worker pool of the forward pass, built for per-token latency.
//!
//! A 30-layer model of 135M parameters runs some 250 parallel operations per
//! generated token, each a few tens of microseconds long, so what a fork/join
//! costs is a visible share of a token. Here the threads are persistent and
//! the caller works too; an operation is published by bumping a generation
//! counter that idle workers spin on for a short while before they park, and
//! items are handed out by one atomic counter, so a slow or preempted thread
//! takes fewer of them. Nothing is allocated, locked or sent per operation
//! while the workers are awake.

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// Spins before a waiting thread starts yielding its core: about the serial
/// gap between two operations of a pass. Beyond it, the thread waited for
/// may be runnable but not running (another process took its core, or it
/// shares this thread's core): spinning on would burn the very timeslice it
/// needs, which on a loaded machine turns each operation into a scheduler
/// tick and a token into a second.
const SPIN: u32 = 1 << 11;

/// Yields before an idle worker parks: bridges the gap between tokens
/// (sampling, the caller's own work) without a wake-up, yet lets an idle
/// model leave the cores to others.
const YIELDS_BEFORE_PARK: u32 = 1 << 12;

/// Runs of rows [`Pool::rows_mut`] makes per thread: enough that a thread
/// slowed by others on its core still finds work left, few enough that the
/// shared counter is taken rarely.
const RUNS_PER_THREAD: usize = 8;

/// The job in flight: a type-erased `&dyn Fn(usize)` as a data pointer and a
/// monomorphized caller, each stored atomically before the generation bump.
struct Shared {
    data: AtomicPtr<()>,
    call: AtomicUsize,
    generation: AtomicUsize,
    /// Workers still running the job of the current generation.
    running: AtomicUsize,
    sleepers: AtomicUsize,
    panicked: AtomicBool,
    stop: AtomicBool,
    lock: Mutex<()>,
    wake: Condvar,
}

pub struct Pool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// Serialises callers: one job in flight at a time.
    busy: Mutex<()>,
}

thread_local! {
    /// Set while a thread runs a job (workers always, the caller during its
    /// share), so a job that reaches the pool again runs inline instead of
    /// waiting for itself.
    static IN_JOB: Cell<bool> = const { Cell::new(false) };
}

unsafe fn call_job<F: Fn(usize) + Sync>(data: *const (), thread: usize) {
    (*(data as *const F))(thread)
}

impl Pool {
    /// `n_threads` threads in all: the caller and `n_threads - 1` workers.
    pub fn new(n_threads: usize) -> std::io::Result<Pool> {
        let shared = Arc::new(Shared {
            data: AtomicPtr::new(std::ptr::null_mut()),
            call: AtomicUsize::new(0),
            generation: AtomicUsize::new(0),
            running: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        let mut workers = Vec::new();
        for i in 1..n_threads.max(1) {
            let mine = shared.clone();
            let worker = std::thread::Builder::new().name(format!("ember-worker-{i}")).spawn(move || work(&mine, i));
            match worker {
                Ok(h) => workers.push(h),
                Err(e) => {
                    let pool = Pool { shared, workers, busy: Mutex::new(()) };
                    drop(pool);
                    return Err(e);
                }
            }
        }
        Ok(Pool { shared, workers, busy: Mutex::new(()) })
    }

    pub fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs `f(thread)` once on every thread of the pool (the caller is
    /// thread 0) and returns when all have finished.
    pub fn run<F: Fn(usize) + Sync>(&self, f: F) {
        if self.workers.is_empty() || IN_JOB.get() {
            return f(0);
        }
        let _one_at_a_time = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        let s = &*self.shared;
        s.data.store(&f as *const F as *mut (), Ordering::Relaxed);
        s.call.store(call_job::<F> as unsafe fn(*const (), usize) as usize, Ordering::Relaxed);
        s.running.store(self.workers.len(), Ordering::Relaxed);
        // SeqCst pairs with the workers' sleepers increment: either they see
        // the new generation or this sees them asleep and wakes them.
        s.generation.fetch_add(1, Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        IN_JOB.set(true);
        let mine = catch_unwind(AssertUnwindSafe(|| f(0)));
        IN_JOB.set(false);
        // `f` lives on this frame: wait for every worker before returning,
        // panicking or not.
        let mut spins = 0u32;
        while s.running.load(Ordering::Acquire) != 0 {
            if spins < SPIN {
                spins += 1;
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        if let Err(p) = mine {
            std::panic::resume_unwind(p);
        }
        if s.panicked.swap(false, Ordering::Relaxed) {
            panic!("a worker thread panicked in a parallel operation");
        }
    }

    /// Calls `f(i)` for every `i < n`, the items shared out dynamically.
    pub fn for_each(&self, n: usize, f: impl Fn(usize) + Sync) {
        if n <= 1 || self.workers.is_empty() || IN_JOB.get() {
            return (0..n).for_each(f);
        }
        let next = AtomicUsize::new(0);
        self.run(|_| loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            if i >= n {
                break;
            }
            f(i);
        });
    }

    /// Calls `f(j, row)` for each `width`-wide row of `data`, the rows
    /// handed out in runs: a prompt's rows are short work (a norm, a
    /// quantized activation), and one shared counter taken per row cost more
    /// than many of them, its cache line going from core to core.
    pub fn rows_mut<T: Send>(&self, data: &mut [T], width: usize, f: impl Fn(usize, &mut [T]) + Sync) {
        let n = data.len() / width;
        let run = n.div_ceil(RUNS_PER_THREAD * self.threads()).max(1);
        let base = SyncPtr(data.as_mut_ptr());
        self.for_each(n.div_ceil(run), |r| {
            for j in r * run..((r + 1) * run).min(n) {
                // SAFETY: each run is handed to exactly one thread and rows are disjoint.
                let row = unsafe { std::slice::from_raw_parts_mut(base.get().add(j * width), width) };
                f(j, row)
            }
        });
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        {
            let _g = self.shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for h in self.workers.drain(..) {
            let _ = h.join();
        }
    }
}

/// A raw pointer shared with the pool's threads by code that hands each
/// element to one thread only.
pub struct SyncPtr<T>(pub *mut T);
unsafe impl<T> Sync for SyncPtr<T> {}
unsafe impl<T> Send for SyncPtr<T> {}
impl<T> SyncPtr<T> {
    /// Through a method, so closures capture the wrapper (which is Sync), not the field.
    #[inline]
    pub fn get(&self) -> *mut T {
        self.0
    }
}

fn work(s: &Shared, index: usize) {
    IN_JOB.set(true);
    let mut seen = 0usize;
    loop {
        let mut spins = 0u32;
        loop {
            let g = s.generation.load(Ordering::Acquire);
            if g != seen {
                seen = g;
                break;
            }
            if s.stop.load(Ordering::Relaxed) {
                return;
            }
            spins += 1;
            if spins < SPIN {
                std::hint::spin_loop();
                continue;
            }
            if spins < SPIN + YIELDS_BEFORE_PARK {
                std::thread::yield_now();
                continue;
            }
            let mut guard = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.sleepers.fetch_add(1, Ordering::SeqCst);
            while s.generation.load(Ordering::SeqCst) == seen && !s.stop.load(Ordering::SeqCst) {
                guard = s.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
            }
            s.sleepers.fetch_sub(1, Ordering::SeqCst);
            spins = 0;
        }
        let data = s.data.load(Ordering::Relaxed) as *const ();
        // SAFETY: `call` was stored from `call_job::<F>` for the `F` that
        // `data` points to, before the generation this thread observed with
        // Acquire; the caller keeps `F` alive until `running` reaches zero.
        let call: unsafe fn(*const (), usize) = unsafe { std::mem::transmute(s.call.load(Ordering::Relaxed)) };
        if catch_unwind(AssertUnwindSafe(|| unsafe { call(data, index) })).is_err() {
            s.panicked.store(true, Ordering::Relaxed);
        }
        s.running.fetch_sub(1, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_item_runs_once() {
        let pool = Pool::new(3).unwrap();
        for n in [0, 1, 2, 7, 1000] {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            pool.for_each(n, |i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1), "n = {n}");
        }
    }

    #[test]
    fn rows_are_disjoint_and_complete() {
        let pool = Pool::new(2).unwrap();
        // Fewer rows than runs, a whole number of runs, and a short last run.
        for n in [1, 12, 32, 1001] {
            let mut data = vec![0usize; n * 5];
            pool.rows_mut(&mut data, 5, |j, row| row.iter_mut().for_each(|v| *v += j + 1));
            for (j, row) in data.chunks(5).enumerate() {
                assert!(row.iter().all(|&v| v == j + 1), "row {j} of {n}");
            }
        }
    }

    #[test]
    fn many_small_jobs_and_parked_workers() {
        let pool = Pool::new(2).unwrap();
        let total = AtomicUsize::new(0);
        for round in 0..20_000 {
            pool.for_each(2, |_| {
                total.fetch_add(1, Ordering::Relaxed);
            });
            if round == 10 {
                // Let the workers run out of spins and park.
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
        }
        assert_eq!(total.load(Ordering::Relaxed), 40_000);
    }

    #[test]
    fn a_panicking_item_reaches_the_caller_and_the_pool_survives() {
        let pool = Pool::new(2).unwrap();
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool.for_each(64, |i| {
                if i == 63 {
                    panic!("item 63");
                }
            })
        }));
        assert!(r.is_err());
        let n = AtomicUsize::new(0);
        pool.for_each(10, |_| {
            n.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(n.load(Ordering::Relaxed), 10);
    }

    #[test]
    fn nested_use_runs_inline() {
        let pool = Pool::new(2).unwrap();
        let n = AtomicUsize::new(0);
        pool.for_each(4, |_| {
            pool.for_each(3, |_| {
                n.fetch_add(1, Ordering::Relaxed);
            })
        });
        assert_eq!(n.load(Ordering::Relaxed), 12);
    }
}
