//! Point-to-point messages over MPI: `Collective::send_bytes`/`recv_bytes` (a length, then the
//! bytes, under a tag of their own), and the probe that names the late ranks after a timeout.

use super::Mpi;
use crate::Result;
use mpi::topology::Communicator;
use std::time::{Duration, Instant};

/// The tag of point-to-point messages (collectives use none; the timeout probe its own).
const P2P_TAG: i32 = 0x5032;

impl Mpi {
    /// `Collective::send_bytes`: the length, then the bytes.
    pub(super) fn send(&mut self, bytes: &[u8], dest: usize) -> Result<()> {
        use mpi::point_to_point::Destination;
        self.check("send", dest < self.size && dest != self.rank, || {
            format!("rank {dest} of {} (not this rank)", self.size)
        })?;
        let to = self.comm.process_at_rank(dest as i32);
        // The length first, so a receiver expecting another size fails clearly.
        let len = bytes.len() as u64;
        mpi::request::scope(|scope| {
            let req = to.immediate_send_with_tag(scope, &len, P2P_TAG);
            self.finish(req, "send");
            let req = to.immediate_send_with_tag(scope, bytes, P2P_TAG);
            self.finish(req, "send");
        });
        Ok(())
    }

    /// `Collective::recv_bytes`: the length, checked, then the bytes.
    pub(super) fn recv(&mut self, out: &mut [u8], src: usize) -> Result<()> {
        use mpi::point_to_point::Source;
        let from = self.peer(src)?;
        let mut len = 0u64;
        mpi::request::scope(|scope| {
            let req = from.immediate_receive_into_with_tag(scope, &mut len, P2P_TAG);
            self.finish(req, "recv");
        });
        if len != out.len() as u64 {
            // The message's bytes would be read as the next length: the world cannot go on (as
            // in process, where the mismatch fails the world).
            let why = format!(
                "recv: {len} bytes sent by rank {src}, {} expected",
                out.len()
            );
            self.abort_job(&why, 3);
        }
        self.body(&from, out);
        Ok(())
    }

    /// Rank `src` of this endpoint, checked (another rank than this one).
    fn peer(&self, src: usize) -> Result<mpi::topology::Process<'_>> {
        self.check("recv", src < self.size && src != self.rank, || {
            format!("rank {src} of {} (not this rank)", self.size)
        })?;
        Ok(self.comm.process_at_rank(src as i32))
    }

    /// A message's bytes after its length, bounded by the timeout.
    fn body(&self, from: &mpi::topology::Process<'_>, out: &mut [u8]) {
        use mpi::point_to_point::Source;
        mpi::request::scope(|scope| {
            let req = from.immediate_receive_into_with_tag(scope, out, P2P_TAG);
            self.finish(req, "recv");
        });
    }

    /// This endpoint's ranks split by `color` (ordered by `key`) as endpoints of their own: a
    /// collective every rank calls.
    pub fn split_mpi(&mut self, color: u32, key: u32) -> Result<Mpi> {
        use mpi::topology::Color;
        self.calls += 1;
        let sub = self
            .comm
            .split_by_color_with_key(Color::with_value(color as i32), key as i32)
            .expect("every rank names a color");
        Ok(Mpi::on(sub, self.timeout, self.report))
    }

    /// A message of any length from `src` (sent with `send_bytes`) into `out`, waited for
    /// without the timeout and, after its first millisecond, without holding a core (a check
    /// every 200 µs): a worker that waits for its next call, however long the server idles.
    pub fn wait_bytes(&mut self, out: &mut Vec<u8>, src: usize) -> Result<()> {
        use mpi::point_to_point::Source;
        let from = self.peer(src)?;
        let mut len = 0u64;
        mpi::request::scope(|scope| {
            let mut req = from.immediate_receive_into_with_tag(scope, &mut len, P2P_TAG);
            let hot = Instant::now() + Duration::from_millis(1);
            loop {
                match req.test() {
                    Ok(_) => break,
                    Err(r) => req = r,
                }
                match Instant::now() < hot {
                    true => std::thread::yield_now(),
                    false => std::thread::sleep(Duration::from_micros(200)),
                }
            }
        });
        out.resize(len as usize, 0);
        self.body(&from, out);
        Ok(())
    }

    /// After a timeout: which ranks are not alive to say so. Every rank that times out tells
    /// every other one on `side`; whoever is heard from within a second (or the timeout, if
    /// shorter) is waiting too, the rest are late. Only called on the way to `MPI_Abort`, so its
    /// sends are left to the abort.
    pub(super) fn late_ranks(&self) -> Vec<usize> {
        use mpi::point_to_point::{Destination, Source};
        const TAG: i32 = 0x4652;
        let call: &'static u64 = Box::leak(Box::new(self.calls));
        for r in (0..self.size).filter(|&r| r != self.rank) {
            let to = self.side.process_at_rank(r as i32);
            let req = to.immediate_send_with_tag(mpi::request::StaticScope, call, TAG);
            std::mem::forget(req);
        }
        let mut heard = vec![false; self.size];
        heard[self.rank] = true;
        let until = Instant::now() + self.timeout.min(Duration::from_secs(1));
        while Instant::now() < until && heard.iter().any(|h| !h) {
            match self.side.any_process().immediate_probe_with_tag(TAG) {
                Some(status) => {
                    let from = self.side.process_at_rank(status.source_rank());
                    let (_call, st): (u64, _) = from.receive_with_tag(TAG);
                    heard[st.source_rank() as usize] = true;
                }
                None => std::thread::sleep(Duration::from_millis(1)),
            }
        }
        (0..self.size).filter(|&r| !heard[r]).collect()
    }
}
