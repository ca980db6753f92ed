//! Split-K ("FlashDecoding") decode attention against head-parallel decode: one sequence at 32k
//! context with one KV head (MQA: 8 query heads share it), head dim 128, blocks of 16 tokens, for
//! every KV format. Head-parallel has one task (one KV head) and leaves the other cores idle;
//! split-K cuts the 32k positions into ranges merged by log-sum-exp. Prints both times, their
//! ratio and the largest relative difference of the outputs. No assertions (speed is not a test;
//! the 1e-6 agreement is tested in `paged_attention::tests`).
//!
//! Then a batched decode step's attention: 8 sequences of 1024 tokens each with TinyLlama's heads
//! (32 query heads over 4 KV heads, HD 64) and Llama-2-7B's (32 over 32, HD 128), f32 and int8
//! KV, head-parallel: the KV bytes read per second against a streaming read timed in the same
//! run. `PA_ONLY=batch` (or `split`) runs one part.
//!
//! Run: `cargo bench -p kernels --bench paged_attention`.

mod common;

use half::bf16;
use kernels::paged_attention::{attend, reference, write, KvShape, KvSlice, KvSliceMut, RowCtx};

fn main() {
    common::cap_from_env();
    let only = std::env::var("PA_ONLY").ok();
    if only.as_deref() != Some("batch") {
        split_k();
    }
    if only.as_deref() != Some("split") {
        batched();
    }
}

/// Head-parallel against split-K at 32k context, every KV format.
fn split_k() {
    let shape = KvShape {
        n_heads: 8,
        n_kv_heads: 1,
        head_dim: 128,
        block: 16,
    };
    let len = 32768;
    let hd = shape.head_dim;
    // A scattered table: block i of the sequence is physical block 7i mod n (n odd).
    let n_blocks = len / shape.block;
    let blocks: Vec<u32> = (0..n_blocks).map(|i| ((i * 7) % n_blocks) as u32).collect();
    let threads = rayon::current_num_threads();
    println!("context {len}, 1 KV head, 8 query heads, HD {hd}; {threads} threads");
    let q = common::fill(3 * 8 * hd, 9, 1.0);
    let keys = common::fill(len * hd, 1, 2.0);
    let values = common::fill(len * hd, 2, 1.0);
    for fmt in ["f32", "bf16", "int8", "fp8"] {
        let n = len * hd;
        let (mut kf, mut vf) = (vec![0.0f32; n], vec![0.0f32; n]);
        let (mut kb, mut vb) = (vec![bf16::ZERO; n], vec![bf16::ZERO; n]);
        let (mut ki, mut vi) = (vec![0i8; n], vec![0i8; n]);
        let (mut ku, mut vu) = (vec![0u8; n], vec![0u8; n]);
        let (mut ks, mut vs) = (vec![0.0f32; len], vec![0.0f32; len]);
        {
            let (mut k, mut v) = match fmt {
                "f32" => (KvSliceMut::F32(&mut kf), KvSliceMut::F32(&mut vf)),
                "bf16" => (KvSliceMut::Bf16(&mut kb), KvSliceMut::Bf16(&mut vb)),
                "int8" => (
                    KvSliceMut::Int8 {
                        codes: &mut ki,
                        scales: &mut ks,
                    },
                    KvSliceMut::Int8 {
                        codes: &mut vi,
                        scales: &mut vs,
                    },
                ),
                _ => (
                    KvSliceMut::Fp8 {
                        codes: &mut ku,
                        scales: &mut ks,
                    },
                    KvSliceMut::Fp8 {
                        codes: &mut vu,
                        scales: &mut vs,
                    },
                ),
            };
            for p in 0..len {
                let (b, s) = (blocks[p / shape.block] as usize, p % shape.block);
                write(&mut k, &keys[p * hd..(p + 1) * hd], b, s, &shape);
                write(&mut v, &values[p * hd..(p + 1) * hd], b, s, &shape);
            }
        }
        let (k, v) = match fmt {
            "f32" => (KvSlice::F32(&kf), KvSlice::F32(&vf)),
            "bf16" => (KvSlice::Bf16(&kb), KvSlice::Bf16(&vb)),
            "int8" => (
                KvSlice::Int8 {
                    codes: &ki,
                    scales: &ks,
                },
                KvSlice::Int8 {
                    codes: &vi,
                    scales: &vs,
                },
            ),
            _ => (
                KvSlice::Fp8 {
                    codes: &ku,
                    scales: &ks,
                },
                KvSlice::Fp8 {
                    codes: &vu,
                    scales: &vs,
                },
            ),
        };
        let rows = [RowCtx {
            blocks: &blocks,
            start: 0,
            len,
        }];
        let width = 3 * 8 * hd / 3 * 3;
        let q = &q[..width];
        let (mut head, mut split) = (vec![0.0f32; 8 * hd], vec![0.0f32; 8 * hd]);
        let splits = 2 * threads;
        let mut parts = vec![0.0f32; shape.partials_len(1, splits)];
        // Alternating runs, so both see the same drift of a shared machine.
        let (mut th, mut ts) = (Vec::new(), Vec::new());
        for _ in 0..15 {
            th.push(common::median_secs(1, || {
                attend(&mut head, q, width, &rows, &k, &v, &shape, 1, &mut [])
            }));
            ts.push(common::median_secs(1, || {
                attend(
                    &mut split, q, width, &rows, &k, &v, &shape, splits, &mut parts,
                )
            }));
        }
        th.sort_by(f64::total_cmp);
        ts.sort_by(f64::total_cmp);
        let (t_head, t_split) = (th[7], ts[7]);
        // Relative to the output's largest magnitude (elements are means of 32k values, many
        // near zero, where an elementwise ratio means nothing).
        let top = head.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        let rel = head
            .iter()
            .zip(&split)
            .map(|(a, b)| (a - b).abs() / top)
            .fold(0.0f32, f32::max);
        let mut exact = vec![0.0f32; 8 * hd];
        reference(&mut exact, q, width, &rows, &k, &v, &shape);
        let err = |x: &[f32]| {
            x.iter()
                .zip(&exact)
                .map(|(a, b)| (a - b).abs() / top)
                .fold(0.0f32, f32::max)
        };
        println!(
            "{fmt:<5} head-parallel {:>7.2} ms  split-K ({splits} splits) {:>7.2} ms  ratio {:.2}  |split - head| {rel:.1e}, vs f64: head {:.1e}, split {:.1e} (of max |out|)",
            t_head * 1e3,
            t_split * 1e3,
            t_split / t_head,
            err(&head),
            err(&split)
        );
    }
}

/// A batched decode step's attention (8 rows of 1024 tokens, scattered blocks), head-parallel,
/// against the streaming read.
fn batched() {
    let bw = common::streaming_read();
    let (rows, len, block) = (8usize, 1024usize, 16usize);
    for (name, nh, nkv, hd) in [("TinyLlama", 32, 4, 64), ("Llama-2-7B", 32, 32, 128)] {
        let shape = KvShape {
            n_heads: nh,
            n_kv_heads: nkv,
            head_dim: hd,
            block,
        };
        let per_row = len / block;
        let n_blocks = rows * per_row;
        // Row r's block i is physical block (r + rows·i)·5 mod n: rows interleaved, scattered.
        let tables: Vec<Vec<u32>> = (0..rows)
            .map(|r| {
                (0..per_row)
                    .map(|i| (((r + rows * i) * 5) % n_blocks) as u32)
                    .collect()
            })
            .collect();
        let n = n_blocks * nkv * block * hd;
        let (kf, vf) = (common::fill(n, 1, 2.0), common::fill(n, 2, 1.0));
        let (mut ki, mut vi) = (vec![0i8; n], vec![0i8; n]);
        let (mut ks, mut vs) = (vec![0.0f32; n / hd], vec![0.0f32; n / hd]);
        {
            let mut k = KvSliceMut::Int8 {
                codes: &mut ki,
                scales: &mut ks,
            };
            let mut v = KvSliceMut::Int8 {
                codes: &mut vi,
                scales: &mut vs,
            };
            for b in 0..n_blocks {
                for s in 0..block {
                    // Every KV head of slot s of block b, gathered from the f32 layout.
                    let gather = |src: &[f32]| -> Vec<f32> {
                        (0..nkv)
                            .flat_map(|h| {
                                let at = ((b * nkv + h) * block + s) * hd;
                                src[at..at + hd].to_vec()
                            })
                            .collect()
                    };
                    write(&mut k, &gather(&kf), b, s, &shape);
                    write(&mut v, &gather(&vf), b, s, &shape);
                }
            }
        }
        let ctx: Vec<RowCtx> = tables
            .iter()
            .map(|t| RowCtx {
                blocks: t,
                start: 0,
                len,
            })
            .collect();
        let q = common::fill(rows * nh * hd, 9, 1.0);
        let mut out = vec![0.0f32; rows * nh * hd];
        let int8 = (
            KvSlice::Int8 {
                codes: &ki,
                scales: &ks,
            },
            KvSlice::Int8 {
                codes: &vi,
                scales: &vs,
            },
        );
        for (fmt, (k, v), bytes_per) in [
            ("f32", (KvSlice::F32(&kf), KvSlice::F32(&vf)), 4 * hd),
            ("int8", int8, hd + 4),
        ] {
            let t = common::median_secs(9, || {
                attend(&mut out, &q, nh * hd, &ctx, &k, &v, &shape, 1, &mut [])
            });
            let bytes = (2 * rows * nkv * len * bytes_per) as f64;
            println!(
                "{name:<10} {fmt:<4} 8 rows x {len}: {:>7.3} ms  {:>6.2} GB/s of KV  \
                 {:>5.1}% of read  {:>6.1} GFLOP/s",
                t * 1e3,
                bytes / t / 1e9,
                100.0 * bytes / t / bw,
                (4 * rows * nh * len * hd) as f64 / t / 1e9
            );
        }
    }
}
