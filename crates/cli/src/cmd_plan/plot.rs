//! `frugal plan --plot memory.svg`: live memory over the step's phases, stacked by category.
//!
//! One band per category (parameters at the bottom, then gradients, optimizer state, activations,
//! KV cache, other), in GiB, with the phases along the x axis. Not here: the numbers (the report).
//! Example: `plot::write_svg(&report, Path::new("memory.svg"))`.

use anyhow::Context;
use fit::report::Report;
use plotters::prelude::*;
use std::path::Path;

const NAMES: [&str; 6] = [
    "parameters",
    "gradients",
    "optimizer state",
    "activations",
    "KV cache",
    "other",
];
const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 140, 140),
];

/// Writes the report's timeline as a stacked-area SVG to `path`.
pub fn write_svg(report: &Report, path: &Path) -> anyhow::Result<()> {
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    // Cumulative tops of each band, phase by phase.
    let tops: Vec<[f64; 6]> = report
        .timeline
        .iter()
        .map(|p| {
            let c = &p.categories;
            let v = [
                c.params_bytes,
                c.grads_bytes,
                c.optimizer_bytes,
                c.activations_bytes,
                c.kv_cache_bytes,
                c.other_bytes,
            ];
            let mut acc = 0.0;
            v.map(|b| {
                acc += gib(b);
                acc
            })
        })
        .collect();
    let n = tops.len().max(2);
    // Headroom above the highest band for the legend, so it covers no data.
    let y_max = tops.iter().map(|t| t[5]).fold(0.0, f64::max).max(1e-6) * 1.45;
    // Bands that hold bytes somewhere (an inference plan has no gradients or optimizer state).
    let used: Vec<usize> = (0..6)
        .filter(|&band| {
            tops.iter()
                .any(|t| t[band] - if band == 0 { 0.0 } else { t[band - 1] } > 0.0)
        })
        .collect();
    let title = match &report.model {
        Some(m) => format!(
            "{} {}: memory per device over the step (GiB)",
            m.name, report.mode
        ),
        None => format!(
            "{} parameters: memory per device (GiB)",
            term::group_digits(report.param_count)
        ),
    };
    let draw = || -> Result<(), Box<dyn std::error::Error>> {
        let root = SVGBackend::new(path, (1000, 560)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 20))
            .margin(12)
            .margin_right(48)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..(n - 1) as f64, 0f64..y_max)?;
        let labels: Vec<String> = report.timeline.iter().map(|p| p.phase.clone()).collect();
        chart
            .configure_mesh()
            .x_desc("phase")
            .y_desc("GiB")
            // One label a phase, at its own point: none between (they would repeat).
            .x_labels(n.min(12))
            .x_label_formatter(&|x| {
                let i = x.round();
                match (x - i).abs() < 1e-6 {
                    true => labels.get(i as usize).cloned().unwrap_or_default(),
                    false => String::new(),
                }
            })
            .draw()?;
        for &band in used.iter().rev() {
            let points: Vec<(f64, f64)> = tops
                .iter()
                .enumerate()
                .map(|(i, t)| (i as f64, t[band]))
                .collect();
            chart
                .draw_series(AreaSeries::new(points, 0.0, COLORS[band].mix(0.85)))?
                .label(NAMES[band])
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 12, y + 5)], COLORS[band].filled())
                });
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperRight)
            .draw()?;
        root.present()?;
        Ok(())
    };
    draw()
        .map_err(|e| anyhow::anyhow!("{e}"))
        .with_context(|| format!("cannot write --plot {}", path.display()))
}
