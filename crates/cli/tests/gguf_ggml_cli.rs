//! SmolLM2-135M-Instruct's Q4_1 GGUF run in its own blocks (`--weights ggml`, the default for a
//! quantized GGUF): greedy text follows llama.cpp's up to a near tie (`dev/golden_smollm2.py` records it), the
//! plan counts the repacked bytes exactly, and three tensor-parallel ranks each hold their share.

mod common;

use common::{frugal, generate_args, json, smollm2};

#[test]
fn ggml_weights_run_the_files_own_blocks_in_their_bytes() {
    let model = smollm2();
    for case in common::smollm2_llamacpp()["greedy"]
        .as_array()
        .unwrap()
        .iter()
        .take(2)
    {
        let prompt = case["prompt"].as_str().unwrap();
        let extra = ["--weights", "ggml", "--json"];
        let v = json(&frugal(&generate_args(
            model.to_str().unwrap(),
            prompt,
            "8",
            &extra,
        )));
        common::parts_only_at_a_near_tie(case, v["tokens"].as_array().unwrap());
        assert_eq!(v["planned"], v["measured"], "planned == measured");
        // An fp32 scale and minimum per 32 weights; the codes of the 30 layers' Q4_1 matrices
        // (106,168,320 weights) two a byte, 0.75 bytes a weight; the Q8_0 embedding's
        // (49152 x 576) one a byte, 1.25; the norms' 35,136 values in f32.
        let params = v["planned"]["params_bytes"].as_u64().unwrap();
        assert_eq!(
            params,
            106_168_320 * 3 / 4 + 49_152 * 576 * 5 / 4 + 4 * 35_136
        );
    }
    // Three tensor-parallel ranks, each holding its rows or whole groups of columns of the
    // file's blocks: the same first tokens, each rank's plan measured to the byte.
    let prompt = "The capital of France is";
    let extra = ["--weights", "ggml", "--tp", "3", "--json"];
    let v = json(&frugal(&generate_args(
        model.to_str().unwrap(),
        prompt,
        "8",
        &extra,
    )));
    let case = &common::smollm2_llamacpp()["greedy"][0];
    common::parts_only_at_a_near_tie(case, v["tokens"].as_array().unwrap());
    for rank in v["ranks"].as_array().unwrap() {
        assert_eq!(rank["planned"], rank["measured"]);
    }
}
