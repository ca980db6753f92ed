//! Fit speed: how many candidate setups `fit::search` weighs per second (memory plan, step time,
//! ranking), against the baseline of the bare formula estimates of the same candidates in a plain
//! loop, same run. The target: over 10,000 candidates weighed in under a second.
//! Run: `cargo bench -p fit --bench fit_speed` (one line per case).

use fit::{self, FitRequest, LoraChoice};
use plan::{formula, presets};
use std::hint::black_box;
use std::time::Instant;

/// Best of three runs of `f`, seconds.
fn best_of_3<F: FnMut()>(mut f: F) -> f64 {
    (0..3)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed().as_secs_f64()
        })
        .fold(f64::MAX, f64::min)
}

fn main() {
    let lora = || LoraChoice {
        rank: 16,
        targets: vec!["all-linear".into()],
    };
    let cases: Vec<(&str, &str, FitRequest)> = vec![
        (
            "llama2-7b 8 GPUs b32",
            "llama2-7b",
            FitRequest::new(32, 2048, 8, 80 << 30),
        ),
        (
            "llama3.1-70b 64 GPUs b512",
            "llama3.1-70b",
            FitRequest::new(512, 4096, 64, 80 << 30),
        ),
        (
            "llama3.1-8b 16 GPUs b256 +lora",
            "llama3.1-8b",
            FitRequest {
                lora: Some(lora()),
                ..FitRequest::new(256, 2048, 16, 80 << 30)
            },
        ),
    ];
    println!("case                            candidates  search s  candidates/s  bare estimates s  search/bare");
    for (label, name, request) in cases {
        let model = presets::by_name(name).unwrap();
        let result = fit::search(&model, &request).unwrap();
        let n = result.candidates_weighed;
        let setups: Vec<_> = result
            .fitting
            .iter()
            .chain(&result.too_big)
            .chain(&result.unsupported)
            .map(|w| w.setup.clone())
            .collect();
        let search_s = best_of_3(|| {
            black_box(fit::search(black_box(&model), black_box(&request)).unwrap());
        });
        let bare_s = best_of_3(|| {
            for s in &setups {
                black_box(formula::training_estimate(&model, s).ok());
            }
        });
        println!(
            "{label:<31} {n:>10}  {search_s:>8.3}  {:>12.0}  {bare_s:>16.3}  {:>11.2}",
            n as f64 / search_s,
            search_s / bare_s
        );
    }
}
