//! Pipes that a stop can leave: a named pipe is opened on a helper thread
//! (an open blocks until a writer comes), and a stream is read on one, so
//! that neither a missing writer nor one that stalls holds up Ctrl-C.

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use voxline_core::ShutdownHandle;

/// How often a wait looks at the stop.
const POLL: Duration = Duration::from_millis(50);
/// How long an open may take before the caller is told it waits.
const TELL_AFTER: Duration = Duration::from_millis(200);
/// Bytes read from the pipe at a time.
const BLOCK: usize = 64 * 1024;

/// How a wait for a pipe's writer ended.
pub(crate) enum Opened {
    /// The pipe is open.
    File(File),
    /// The stop came first.
    Stopped,
}

/// Opens `path` (a named pipe) on a helper thread; calls `waiting` once if
/// no writer has come within 200 ms; gives up when `stop` is requested.
pub(crate) fn open_waiting(
    path: &Path,
    stop: &ShutdownHandle,
    waiting: &dyn Fn(),
) -> io::Result<Opened> {
    let (tx, rx) = sync_channel(1);
    let p = path.to_owned();
    std::thread::Builder::new()
        .name("open-pipe".into())
        .spawn(move || {
            let _ = tx.send(File::open(&p));
        })?;
    let started = Instant::now();
    let mut told = false;
    loop {
        match rx.recv_timeout(POLL) {
            Ok(opened) => return opened.map(Opened::File),
            Err(RecvTimeoutError::Timeout) if stop.is_requested() => return Ok(Opened::Stopped),
            Err(RecvTimeoutError::Timeout) => {
                if !told && started.elapsed() >= TELL_AFTER {
                    waiting();
                    told = true;
                }
            }
            Err(RecvTimeoutError::Disconnected) => {
                return Err(io::Error::other("the thread opening it ended"))
            }
        }
    }
}

/// A stream read on its own thread: a read waits for the next block, and
/// once `stop` is requested it ends the stream (end of file) instead.
pub(crate) struct StopRead {
    blocks: Mutex<Receiver<io::Result<Vec<u8>>>>,
    block: Vec<u8>,
    pos: usize,
    done: bool,
    stop: ShutdownHandle,
}

impl StopRead {
    /// Reads `inner` on a thread of its own.
    ///
    /// # Errors
    /// When the thread cannot start.
    pub(crate) fn wrap<R: Read + Send + 'static>(
        mut inner: R,
        stop: ShutdownHandle,
    ) -> io::Result<StopRead> {
        let (tx, rx) = sync_channel::<io::Result<Vec<u8>>>(4);
        std::thread::Builder::new()
            .name("read-pipe".into())
            .spawn(move || loop {
                let mut b = vec![0u8; BLOCK];
                let item = match inner.read(&mut b) {
                    Ok(n) => {
                        b.truncate(n);
                        Ok(b)
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => Err(e),
                };
                let last = !matches!(&item, Ok(b) if !b.is_empty());
                if tx.send(item).is_err() || last {
                    return;
                }
            })?;
        Ok(StopRead {
            blocks: Mutex::new(rx),
            block: Vec::new(),
            pos: 0,
            done: false,
            stop,
        })
    }
}

impl Read for StopRead {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        loop {
            if self.pos < self.block.len() {
                let n = out.len().min(self.block.len() - self.pos);
                out[..n].copy_from_slice(&self.block[self.pos..self.pos + n]);
                self.pos += n;
                return Ok(n);
            }
            if self.done || out.is_empty() {
                return Ok(0);
            }
            let next = self
                .blocks
                .get_mut()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .recv_timeout(POLL);
            match next {
                Ok(Ok(b)) if b.is_empty() => self.done = true,
                Ok(Ok(b)) => (self.block, self.pos) = (b, 0),
                Ok(Err(e)) => {
                    self.done = true;
                    return Err(e);
                }
                Err(RecvTimeoutError::Timeout) => {
                    if self.stop.is_requested() {
                        self.done = true;
                    }
                }
                Err(RecvTimeoutError::Disconnected) => self.done = true,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader that gives its bytes, then blocks until its gate closes.
    struct Stalls(Vec<u8>, std::sync::mpsc::Receiver<()>);

    impl Read for Stalls {
        fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
            if self.0.is_empty() {
                let _ = self.1.recv();
                return Ok(0);
            }
            let n = out.len().min(self.0.len());
            out[..n].copy_from_slice(&self.0[..n]);
            self.0.drain(..n);
            Ok(n)
        }
    }

    #[test]
    fn a_stalled_stream_ends_when_the_stop_comes() {
        let (gate, held) = std::sync::mpsc::channel();
        let stop = ShutdownHandle::new();
        let mut r = StopRead::wrap(Stalls(b"header".to_vec(), held), stop.clone()).unwrap();
        let mut got = [0u8; 6];
        r.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"header");
        let t = Instant::now();
        let halt = stop.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(150));
            halt.request();
        });
        let mut rest = Vec::new();
        r.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty());
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        drop(gate);
    }

    #[test]
    fn a_stream_is_read_whole_and_in_order() {
        let bytes: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let stop = ShutdownHandle::new();
        let mut r = StopRead::wrap(io::Cursor::new(bytes.clone()), stop).unwrap();
        let mut got = Vec::new();
        r.read_to_end(&mut got).unwrap();
        assert_eq!(got, bytes);
    }
}
