//! Where offloaded optimizer state lives: one f32 region per unit holding `master | m | v`,
//! backed by a `Vec` or by a memory-mapped file. Holds no model knowledge beyond unit sizes.
//!
//! Example: `OffloadStore::on_disk(path, &[n0, n1])?.step_unit(1, grads, working, step)`.

use super::OffloadError;
use crate::precision::{adamw_master_step, Grads, MasterStep, Working};
use memmap2::MmapMut;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Units start on multiples of this many f32 (64 bytes, a cache line).
const ALIGN_ELEMS: usize = 16;
/// Zeros written per call while sizing the file.
const FILL_BYTES: usize = 1 << 20;

/// One unit's state, borrowed from the store.
pub struct UnitState<'a> {
    pub master: &'a mut [f32],
    pub m: &'a mut [f32],
    pub v: &'a mut [f32],
}

enum Backing {
    Ram(Vec<f32>),
    Disk { map: MmapMut, path: PathBuf },
}

/// Master weights and Adam moments of every unit, off the device.
pub struct OffloadStore {
    backing: Backing,
    /// Per unit: (offset in f32 of its region, elements per array).
    spans: Vec<(usize, usize)>,
    total_elems: usize,
}

/// Region offsets for units of `numels` elements and the total f32 count.
fn spans_of(numels: &[u64]) -> (Vec<(usize, usize)>, usize) {
    let mut spans = Vec::with_capacity(numels.len());
    let mut offset = 0usize;
    for &n in numels {
        let n = n as usize;
        spans.push((offset, n));
        offset += (3 * n).div_ceil(ALIGN_ELEMS) * ALIGN_ELEMS;
    }
    (spans, offset)
}

impl OffloadStore {
    /// State in host memory, zeroed (`numels`: elements per unit, padded as the plan pads them).
    pub fn in_memory(numels: &[u64]) -> OffloadStore {
        let (spans, total_elems) = spans_of(numels);
        OffloadStore {
            backing: Backing::Ram(vec![0.0; total_elems]),
            spans,
            total_elems,
        }
    }

    /// State in a new file at `path`, zeroed and fully written before mapping.
    pub fn on_disk(path: &Path, numels: &[u64]) -> Result<OffloadStore, OffloadError> {
        let (spans, total_elems) = spans_of(numels);
        if total_elems == 0 {
            return Err(OffloadError::Empty);
        }
        let bytes = 4 * total_elems as u64;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(|e| OffloadError::CreateFile {
                path: path.to_path_buf(),
                reason: e.to_string(),
            })?;
        if let Err(reason) = fill_zeros(&file, bytes) {
            let _ = std::fs::remove_file(path);
            return Err(OffloadError::Allocate {
                path: path.to_path_buf(),
                bytes,
                reason,
            });
        }
        // SAFETY: the file was created here (create_new) and is private to this store; nothing
        // else maps or truncates it while the map lives.
        let map = unsafe { MmapMut::map_mut(&file) }.map_err(|e| {
            let _ = std::fs::remove_file(path);
            OffloadError::Map {
                path: path.to_path_buf(),
                reason: e.to_string(),
            }
        })?;
        assert_eq!(map.as_ptr() as usize % 4, 0, "mappings are page aligned");
        Ok(OffloadStore {
            backing: Backing::Disk {
                map,
                path: path.to_path_buf(),
            },
            spans,
            total_elems,
        })
    }

    pub fn n_units(&self) -> usize {
        self.spans.len()
    }

    /// Bytes the state occupies (host memory or file size).
    pub fn bytes(&self) -> u64 {
        4 * self.total_elems as u64
    }

    /// The backing file, for `optimizer:disk`.
    pub fn path(&self) -> Option<&Path> {
        match &self.backing {
            Backing::Ram(_) => None,
            Backing::Disk { path, .. } => Some(path),
        }
    }

    fn all_mut(&mut self) -> &mut [f32] {
        match &mut self.backing {
            Backing::Ram(v) => v,
            Backing::Disk { map, .. } => {
                let len = map.len() / 4;
                // SAFETY: the map is page aligned, `len * 4` bytes long and exclusively borrowed
                // through `self`; every bit pattern is a valid f32.
                unsafe { std::slice::from_raw_parts_mut(map.as_mut_ptr().cast::<f32>(), len) }
            }
        }
    }

    /// Unit `i`'s master weights and moments.
    pub fn unit(&mut self, i: usize) -> UnitState<'_> {
        let (offset, n) = self.spans[i];
        let region = &mut self.all_mut()[offset..offset + 3 * n];
        let (master, rest) = region.split_at_mut(n);
        let (m, v) = rest.split_at_mut(n);
        UnitState { master, m, v }
    }

    /// Unit `i`'s `[master, m, v]`, read-only (for snapshots).
    pub fn unit_view(&self, i: usize) -> [&[f32]; 3] {
        let (offset, n) = self.spans[i];
        let all: &[f32] = match &self.backing {
            Backing::Ram(v) => v,
            Backing::Disk { map, .. } => {
                // SAFETY: as in `all_mut`, shared instead of exclusive.
                unsafe { std::slice::from_raw_parts(map.as_ptr().cast::<f32>(), map.len() / 4) }
            }
        };
        let region = &all[offset..offset + 3 * n];
        [&region[..n], &region[n..2 * n], &region[2 * n..]]
    }

    /// One AdamW step of unit `i` on the host; writes the device's working copy if given.
    pub fn step_unit(
        &mut self,
        i: usize,
        grads: Grads<'_>,
        working: Option<Working<'_>>,
        step: MasterStep,
    ) {
        let s = self.unit(i);
        adamw_master_step(s.master, s.m, s.v, grads, working, step);
    }

    /// Writes dirty pages of the file back (a no-op in memory); for snapshots of the file.
    pub fn flush(&self) -> Result<(), OffloadError> {
        match &self.backing {
            Backing::Ram(_) => Ok(()),
            Backing::Disk { map, path } => map.flush().map_err(|e| OffloadError::Flush {
                path: path.clone(),
                reason: e.to_string(),
            }),
        }
    }
}

impl Drop for OffloadStore {
    fn drop(&mut self) {
        if let Backing::Disk { path, .. } = &self.backing {
            // Scratch space this store created; failing to remove it loses nothing.
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Writes `bytes` zeros so the filesystem reserves the blocks now (a sparse file would fail
/// later, on a page fault, when the disk fills up).
fn fill_zeros(mut file: &File, bytes: u64) -> Result<(), String> {
    let zeros = vec![0u8; FILL_BYTES];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(FILL_BYTES as u64) as usize;
        file.write_all(&zeros[..n]).map_err(|e| e.to_string())?;
        left -= n as u64;
    }
    Ok(())
}
