//! Admission: at most `max_batch` generations run, at most `max_queue` wait for a slot; a
//! request beyond that is refused at once (503) rather than queued without bound.
//!
//! A [`Ticket`] is a place in the queue; [`Ticket::slot`] waits for a running [`Slot`]. Both
//! release what they hold when dropped — a client that disconnects while waiting leaves the queue,
//! and a generation that ends (or is cancelled) frees its slot.

use crate::error::ApiError;
use crate::metrics::Metrics;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The server's slots and queue.
pub struct Slots {
    max_batch: usize,
    max_queue: usize,
    /// Requests admitted and not yet finished: running + waiting.
    admitted: AtomicUsize,
    running: Arc<Semaphore>,
    metrics: Arc<Metrics>,
}

/// An admitted request waiting for a slot.
pub struct Ticket {
    slots: Arc<Slots>,
    waiting: bool,
}

/// A running generation's slot.
pub struct Slot {
    _ticket: Ticket,
    _permit: OwnedSemaphorePermit,
}

impl Slots {
    pub fn new(max_batch: usize, max_queue: usize, metrics: Arc<Metrics>) -> Self {
        Self {
            max_batch,
            max_queue,
            admitted: AtomicUsize::new(0),
            running: Arc::new(Semaphore::new(max_batch)),
            metrics,
        }
    }

    pub fn max_batch(&self) -> usize {
        self.max_batch
    }

    /// A place in the queue, or 503 when every slot is busy and the queue is full.
    pub fn admit(self: &Arc<Self>) -> Result<Ticket, ApiError> {
        let cap = self.max_batch + self.max_queue;
        let mut n = self.admitted.load(Ordering::Acquire);
        loop {
            if n >= cap {
                return Err(ApiError::overloaded(format!(
                    "the server is busy: {} requests running and {} waiting (the queue holds \
                     {}); retry later",
                    self.max_batch, self.max_queue, self.max_queue
                )));
            }
            match self
                .admitted
                .compare_exchange(n, n + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => break,
                Err(now) => n = now,
            }
        }
        self.metrics.waiting.fetch_add(1, Ordering::Relaxed);
        Ok(Ticket {
            slots: self.clone(),
            waiting: true,
        })
    }
}

impl Ticket {
    /// Waits for a free slot.
    pub async fn slot(mut self) -> Slot {
        let permit = self
            .slots
            .running
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        let m = &self.slots.metrics;
        m.waiting.fetch_sub(1, Ordering::Relaxed);
        m.running.fetch_add(1, Ordering::Relaxed);
        self.waiting = false;
        Slot {
            _ticket: self,
            _permit: permit,
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let m = &self.slots.metrics;
        if self.waiting {
            m.waiting.fetch_sub(1, Ordering::Relaxed);
        } else {
            m.running.fetch_sub(1, Ordering::Relaxed);
        }
        self.slots.admitted.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_queue_is_bounded_and_slots_are_freed_on_drop() {
        let metrics = Arc::new(Metrics::new("m"));
        let slots = Arc::new(Slots::new(1, 1, metrics.clone()));
        let a = slots.admit().unwrap().slot().await;
        let b = slots.admit().unwrap();
        assert_eq!(slots.admit().err().map(|e| e.status.as_u16()), Some(503));
        assert_eq!(metrics.running.load(Ordering::Relaxed), 1);
        assert_eq!(metrics.waiting.load(Ordering::Relaxed), 1);
        drop(a);
        let b = b.slot().await;
        let c = slots.admit().unwrap();
        drop(c);
        drop(b);
        assert_eq!(metrics.running.load(Ordering::Relaxed), 0);
        assert_eq!(metrics.waiting.load(Ordering::Relaxed), 0);
        assert_eq!(slots.admitted.load(Ordering::Relaxed), 0);
    }
}
