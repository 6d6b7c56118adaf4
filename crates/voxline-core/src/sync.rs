//! Locking that outlives a panic.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `m` even if a thread panicked holding it. Every mutex the
/// pipeline shares between threads guards state that each update leaves
/// whole (a counter, a list, a board), so a panic elsewhere (reported as
/// the stage's failure) must not turn every later lock into a second one.
pub fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    #[test]
    fn a_mutex_poisoned_by_a_panic_still_locks_with_what_it_held() {
        let m = Arc::new(Mutex::new(vec![1]));
        let m2 = Arc::clone(&m);
        let r = std::thread::spawn(move || {
            let mut g = m2.lock().unwrap();
            g.push(2);
            panic!("a stage panics holding the lock");
        })
        .join();
        assert!(r.is_err() && m.is_poisoned());
        assert_eq!(*super::lock(&m), vec![1, 2]);
    }
}
