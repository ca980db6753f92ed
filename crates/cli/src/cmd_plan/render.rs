//! `frugal plan`'s human output: the breakdown at the peak as a table (GiB and GB side by side),
//! the process totals, host memory, the predicted step time and the fit verdict.
//! Example: `print!("{}", render(&report))`.

use fit::report::Report;
use term::{gigabytes, human_bytes, Table};

fn size_cells(bytes: u64) -> Vec<String> {
    vec![human_bytes(bytes), gigabytes(bytes), bytes.to_string()]
}

fn describe(report: &Report) -> String {
    let what = match &report.model {
        Some(m) => format!(
            "{} ({} parameters)",
            m.name,
            term::group_digits(report.param_count)
        ),
        None => format!(
            "{} parameters (model states only)",
            term::group_digits(report.param_count)
        ),
    };
    let what = match &report.largest {
        Some(l) => format!(
            "{what}; largest module {} ({} parameters), largest unit {} ({})",
            l.module,
            term::group_digits(l.module_params),
            l.unit,
            term::group_digits(l.unit_params)
        ),
        None => what,
    };
    let mut note = match &report.runtime_note {
        Some(n) => format!("note: {n}\n"),
        None => String::new(),
    };
    if let Some(c) = &report.config {
        note.push_str(&format!("config {}: {}\n", c.file, c.summary));
        for n in &c.not_planned {
            note.push_str(&format!("  not planned: {n}\n"));
        }
    }
    if !report.rank_peaks.is_empty() {
        note.push_str("every rank planned (the table is the busiest one's):\n");
        let staged = report.rank_peaks.iter().any(|r| r.stage > 0);
        for r in &report.rank_peaks {
            let stage = match staged {
                true => format!(
                    "stage {} (layers {}..{}), ",
                    r.stage,
                    r.first_layer,
                    r.first_layer + r.layers
                ),
                false => String::new(),
            };
            note.push_str(&format!(
                "  {stage}tp rank {}: peak {} = {} bytes\n",
                r.tp_rank,
                term::human_bytes(r.peak_bytes),
                r.peak_bytes
            ));
        }
    }
    let convention = match (report.runtime.as_str(), report.mode) {
        ("formula", "train") => format!(
            " (convention {})",
            report.setup["convention"].as_str().unwrap_or("deepspeed")
        ),
        _ => String::new(),
    };
    format!(
        "{what}, {}, runtime {}{convention}\n{note}",
        report.mode, report.runtime
    )
}

/// The human-readable answer: the breakdown at the peak, then the process totals.
pub fn render(report: &Report) -> String {
    let mut out = describe(report);
    out.push_str(&format!(
        "per device, at the peak ({}):\n",
        report.peak_phase
    ));
    let mut t = Table::new(&["", "binary", "decimal", "bytes"]);
    let c = &report.per_device.categories;
    let rows = [
        ("parameters", c.params_bytes),
        ("gradients", c.grads_bytes),
        ("optimizer state", c.optimizer_bytes),
        ("activations", c.activations_bytes),
        ("KV cache", c.kv_cache_bytes),
        ("other (buckets, workspaces)", c.other_bytes),
        ("peak of live tensors", report.per_device.peak_bytes),
        (
            "reserved by the allocator",
            report.per_device.reserved_bytes,
        ),
        ("CUDA context", report.per_device.context_bytes),
        ("total (nvidia-smi)", report.per_device.total_bytes),
    ];
    for (name, bytes) in rows {
        let mut cells = vec![name.to_string()];
        cells.extend(size_cells(bytes));
        t.row(cells);
    }
    out.push_str(&t.render());
    if let Some(h) = &report.host {
        out.push_str(&format!(
            "host memory (offload): {} = {} (optimizer state {}, gradients {}, parameters {})\n",
            human_bytes(h.peak_bytes),
            gigabytes(h.peak_bytes),
            human_bytes(h.categories.optimizer_bytes),
            human_bytes(h.categories.grads_bytes),
            human_bytes(h.categories.params_bytes)
        ));
    }
    if let (Some(t), Some(gpu)) = (&report.step_time, &report.gpu) {
        out.push_str(&format!(
            "predicted step on one {gpu} per rank: {:.3} s, {:.0} tokens/s over the ranks, bound by {} (frugal fit ranks by it)\n",
            t.step_s,
            t.tokens_per_s,
            t.bottleneck.label()
        ));
    }
    if let Some(h) = &report.host_node {
        out.push_str(&format!(
            "host memory per node ({} ranks): {} = {} (offloaded state {}, model copies while loading {})\n",
            h.ranks,
            human_bytes(h.peak_bytes),
            gigabytes(h.peak_bytes),
            human_bytes(h.offload_bytes),
            human_bytes(h.load_bytes)
        ));
    }
    if let Some(i) = &report.inference {
        out.push_str(&format!(
            "KV cache: {} per token; paged waste {}; prefill peak {}, decode peak {}\n",
            human_bytes(i.kv_bytes_per_token),
            human_bytes(i.kv_waste_bytes),
            human_bytes(i.prefill_peak_bytes),
            human_bytes(i.decode_peak_bytes)
        ));
    }
    if let (Some(dev), Some(fits)) = (report.device_memory_bytes, report.fits) {
        let total = report.per_device.total_bytes;
        out.push_str(&if fits {
            format!(
                "fits in {} ({} to spare)\n",
                human_bytes(dev),
                human_bytes(dev - total)
            )
        } else {
            format!(
                "does NOT fit in {} (short by {})\n",
                human_bytes(dev),
                human_bytes(total - dev)
            )
        });
        if let Some(fix) = &report.fix {
            out.push_str(&format!(
                "the nearest setup that fits: {}\n",
                fix.description
            ));
        } else if !fits && report.mode == "train" && report.model.is_some() {
            out.push_str(
                "no setup within reach fits (same GPUs, batch and precision): try `frugal fit`\n",
            );
        }
    }
    out
}
