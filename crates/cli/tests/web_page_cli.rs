//! The planner's page in headless Chromium: after a knob changes it shows the number the API
//! and the CLI give; a setup that does not fit shows the nearest one that does without a click,
//! and applying it fits; the timeline names its phases and draws the capacity; a pasted
//! ds_config.json plans as `--deepspeed` does. Screenshots are left in `target/web/`.

mod common;

use common::web::{dump_dom, screenshot, Server};
use serde_json::Value;

#[test]
fn the_page_shows_what_the_api_says_after_a_knob_changes() {
    let server = Server::start();
    let page = |query: &str| format!("http://127.0.0.1:{}/?{query}", server.port);
    // Load llama3.1-8b on 8 GPUs at ZeRO-3, then switch the ZeRO select to 2 as a person would.
    let url = page("model=llama3.1-8b&gpus=8&zero=3&batch=4&then=zero:2");
    let dom = dump_dom(&url);
    let shown: u64 = dom
        .split("data-bytes=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no total on the page:\n{dom}"));
    assert!(
        dom.contains("data-updates=\"2\""),
        "the knob change re-planned:\n{dom}"
    );
    let command = dom
        .split("id=\"command\">")
        .nth(1)
        .and_then(|s| s.split('<').next())
        .expect("the command on the page");
    assert!(command.contains("--zero 2"), "{command}");
    // The API for the same knobs, and the CLI for the command the page shows.
    let q =
        "model=llama3.1-8b&train=true&gpus=8&zero=2&batch=4&seq=2048&gpu=h100&device-memory=80GiB";
    let (_, api) = server.json("GET", &format!("/api/plan?{q}"), "");
    assert_eq!(shown, api["per_device"]["total_bytes"].as_u64().unwrap());
    let mut words: Vec<&str> = command.split_whitespace().skip(1).collect();
    words.push("--json");
    let cli = common::json(&common::frugal(&words));
    assert_eq!(shown, cli["per_device"]["total_bytes"].as_u64().unwrap());
    // A bad knob shows the CLI's error next to its field.
    let bad = page("model=llama3.1-8b&tp=3");
    let dom = dump_dom(&bad);
    assert!(
        dom.contains("class=\"err live\"") && dom.contains("--tp"),
        "{dom}"
    );
    // A screenshot for a person to look at.
    screenshot(
        &page("model=llama3.1-8b&gpus=8&zero=3&batch=4"),
        "1400,1500",
        "plan.png",
    );
}

/// The text between `start` and the next `end` after it in `dom`.
fn between<'a>(dom: &'a str, start: &str, end: &str) -> Option<&'a str> {
    dom.split(start).nth(1).and_then(|s| s.split(end).next())
}

#[test]
fn a_setup_that_does_not_fit_shows_its_fix_at_once_and_the_timeline_its_axes() {
    let server = Server::start();
    let page = |query: &str| format!("http://127.0.0.1:{}/?{query}", server.port);
    // Llama-3.1-8B at 4 x 4096 on one 80 GiB H100 does not fit; nothing is clicked.
    let url = page("model=llama3.1-8b&batch=4&seq=4096");
    let dom = dump_dom(&url);
    assert!(dom.contains("does NOT fit"), "{dom}");
    let fix = between(&dom, "<div id=\"fix\"", ">").expect("the fix box");
    assert!(
        !fix.contains("hidden"),
        "the fix shows without a click: {fix}"
    );
    let flags = between(fix, "data-flags=\"", "\"").expect("the fix's flags");
    assert!(dom.contains("id=\"apply_fix\""), "one click applies it");
    // The flags it shows make the same plan fit, on the command line too.
    let mut args = vec!["plan", "--model", "llama3.1-8b", "--seq", "4096"];
    if !flags.contains("--batch") {
        args.extend(["--batch", "4"]);
    }
    args.extend(flags.split_whitespace());
    args.extend(["--device-memory", "80GiB", "--json"]);
    let v: Value = common::json(&common::frugal(&args));
    assert_eq!(v["fits"], true, "{flags}");
    // The timeline: memory ticks, the phases by name on the time axis, the capacity line.
    let svg = between(&dom, "<svg id=\"timeline\"", "</svg>").expect("the timeline");
    for label in [
        "embed",
        "forward 0–31",
        "head",
        "backward 31–0",
        "optimizer",
        "time: the phases of one step",
        "0 B",
        "capacity 80.00 GiB",
    ] {
        assert!(svg.contains(label), "the timeline shows {label:?}:\n{svg}");
    }
    assert!(svg.contains("id=\"capacity\""), "{svg}");
    screenshot(&url, "1400,1300", "does_not_fit.png");
    // Inference shows inference's knobs only, and its own fix: a weight and KV format that fit.
    let url = page("model=llama3.1-8b&mode=infer&gpu=rtx4090&seq=8192&batch=8");
    let dom = dump_dom(&url);
    let fix = between(&dom, "<div id=\"fix\"", "</div>").expect("the fix box");
    assert!(
        fix.contains("--weights") && !fix.contains("hidden"),
        "{fix}"
    );
    for train_only in [
        "name=\"gpus\"",
        "name=\"zero\"",
        "id=\"dsconfig\"",
        "id=\"fit_batch\"",
    ] {
        let at = dom
            .find(train_only)
            .unwrap_or_else(|| panic!("{train_only} on the page"));
        let before = &dom[..at];
        let label = &before[before.rfind("<label").unwrap_or(0)..];
        let set = &before[before.rfind("<fieldset").unwrap_or(0)..];
        let hidden = |s: &str| {
            s.split('>')
                .next()
                .is_some_and(|tag| tag.contains("hidden"))
        };
        assert!(
            hidden(label) || hidden(set) || dom[at.saturating_sub(80)..at].contains("train hidden"),
            "{train_only} shows in inference mode"
        );
    }
    screenshot(&url, "1400,1100", "inference_fix.png");
}

/// A ds_config.json pasted on the page plans as `frugal plan --deepspeed` plans the file.
#[test]
fn a_pasted_ds_config_plans_as_the_cli_plans_the_file() {
    let server = Server::start();
    let dir = common::temp_dir("web", "ds_config");
    let ds = r#"{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,
        "bf16": {"enabled": true}, "zero_optimization": {"stage": 3}}"#;
    let path = dir.join("ds_config.json");
    std::fs::write(&path, ds).unwrap();
    let cli = common::json(&common::frugal(&[
        "plan",
        "--model",
        "llama3-8b",
        "--gpus",
        "8",
        "--deepspeed",
        path.to_str().unwrap(),
        "--json",
    ]));
    let (status, api) = server.json(
        "POST",
        "/api/plan?model=llama3-8b&gpus=8&paste=deepspeed",
        ds,
    );
    assert_eq!(status, 200, "{api}");
    assert_eq!(api["per_device"], cli["per_device"]);
    assert!(api["command"]
        .as_str()
        .unwrap()
        .contains("--deepspeed ds_config.json"));
    // With a pasted config.json as well: both in one JSON body.
    let config = r#"{"model_type": "llama", "hidden_size": 256, "intermediate_size": 688,
        "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4,
        "vocab_size": 32000, "max_position_embeddings": 2048}"#;
    let body = serde_json::json!({ "config": config, "deepspeed": ds }).to_string();
    let (status, v) = server.json("POST", "/api/plan?gpus=8&paste=both", &body);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["setup"]["zero"], "zero3");
    assert_eq!(v["model"]["d_model"], 256);
    // A bad pasted config gets the reader's error.
    let (status, v) = server.json(
        "POST",
        "/api/plan?model=llama3-8b&paste=deepspeed",
        r#"{"zero_optimisation": {}}"#,
    );
    assert_eq!(status, 400);
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("did you mean zero_optimization"),
        "{v}"
    );
}
