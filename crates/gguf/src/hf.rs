//! A GGUF model in Hugging Face terms: its `config.json` (from the architecture's metadata) and
//! each HF tensor (`model.layers.3.self_attn.q_proj.weight`) from the GGUF tensor that holds it
//! (`blk.3.attn_q.weight`), dequantized, in HF's (out, in) shape.
//!
//! llama.cpp's converter reorders the rows of a `llama` model's q and k projections within each
//! head (HF's rotate-half RoPE layout to ggml's interleaved pairs); [`Model::tensor`] undoes it,
//! so the values are the checkpoint's again. `qwen2` files keep HF's order (ggml runs them with
//! NeoX RoPE).
//!
//! Example: `let m = gguf::hf::Model::new(&file)?; let cfg = m.config_json()?;`

use crate::{quant, Gguf, GgufError, Result};

/// The architectures whose tensors map onto a Hugging Face model this way.
const ARCHITECTURES: [&str; 2] = ["llama", "qwen2"];

/// A GGUF file read as a Hugging Face model.
pub struct Model<'a> {
    pub file: &'a Gguf,
    pub arch: &'a str,
}

impl<'a> Model<'a> {
    /// The file as an HF model, or an error naming an architecture this mapping does not know.
    pub fn new(file: &'a Gguf) -> Result<Model<'a>> {
        let arch = file.architecture()?;
        if !ARCHITECTURES.contains(&arch) {
            return Err(GgufError::Metadata {
                path: file.path.clone(),
                key: "general.architecture".into(),
                what: format!(
                    "{arch:?} is not read as a model; {} are",
                    ARCHITECTURES.join(" and ")
                ),
            });
        }
        Ok(Model { file, arch })
    }

    fn key(&self, name: &str) -> String {
        format!("{}.{name}", self.arch)
    }

    /// The vocabulary size: the tokenizer's token count, else `<arch>.vocab_size`, else the
    /// embedding's rows.
    pub fn vocab_size(&self) -> Result<u64> {
        if let Ok(tokens) = self.file.get("tokenizer.ggml.tokens") {
            if let Some(t) = tokens.as_array() {
                return Ok(t.len() as u64);
            }
        }
        match self.file.u64(&self.key("vocab_size")) {
            Ok(v) => Ok(v),
            Err(_) => Ok(self.file.tensor("token_embd.weight")?.rows()),
        }
    }

    /// The model's `config.json`, as transformers would write it for this checkpoint.
    pub fn config_json(&self) -> Result<String> {
        let f = self.file;
        let heads = f.u64(&self.key("attention.head_count"))?;
        let kv_heads = f.u64(&self.key("attention.head_count_kv")).unwrap_or(heads);
        let d_model = f.u64(&self.key("embedding_length"))?;
        let rope_theta = f.f64(&self.key("rope.freq_base")).unwrap_or(10000.0);
        let eps = f.f64(&self.key("attention.layer_norm_rms_epsilon"))?;
        let vocab = self.vocab_size()?;
        let embed_rows = f.tensor("token_embd.weight")?.rows();
        if embed_rows != vocab {
            return Err(GgufError::Tensor {
                path: f.path.clone(),
                tensor: "token_embd.weight".into(),
                what: format!("{embed_rows} rows for a vocabulary of {vocab} tokens"),
            });
        }
        let tied = f.tensor("output.weight").is_err();
        let mut config = format!(
            "{{\"model_type\": \"{}\", \"architectures\": [\"{}\"], \"vocab_size\": {vocab}, \
             \"hidden_size\": {d_model}, \"intermediate_size\": {}, \"num_hidden_layers\": {}, \
             \"num_attention_heads\": {heads}, \"num_key_value_heads\": {kv_heads}, \
             \"head_dim\": {}, \"max_position_embeddings\": {}, \"rms_norm_eps\": {eps:e}, \
             \"rope_theta\": {rope_theta:e}, \"tie_word_embeddings\": {tied}, \
             \"hidden_act\": \"silu\"",
            self.arch,
            if self.arch == "qwen2" {
                "Qwen2ForCausalLM"
            } else {
                "LlamaForCausalLM"
            },
            f.u64(&self.key("feed_forward_length"))?,
            f.u64(&self.key("block_count"))?,
            d_model / heads,
            f.u64(&self.key("context_length"))?,
        );
        for (key, hf) in [
            ("tokenizer.ggml.bos_token_id", "bos_token_id"),
            ("tokenizer.ggml.eos_token_id", "eos_token_id"),
        ] {
            if let Ok(id) = f.u64(key) {
                config.push_str(&format!(", \"{hf}\": {id}"));
            }
        }
        config.push('}');
        Ok(config)
    }

    /// The GGUF name of HF tensor `hf`, if this mapping has one.
    pub fn gguf_name(&self, hf: &str) -> Option<String> {
        let fixed = match hf {
            "model.embed_tokens.weight" => Some("token_embd.weight"),
            "model.norm.weight" => Some("output_norm.weight"),
            "lm_head.weight" => Some("output.weight"),
            _ => None,
        };
        if let Some(name) = fixed {
            return Some(name.into());
        }
        let rest = hf.strip_prefix("model.layers.")?;
        let (layer, part) = rest.split_once('.')?;
        layer.parse::<u32>().ok()?;
        let mapped = match part {
            "input_layernorm.weight" => "attn_norm.weight",
            "post_attention_layernorm.weight" => "ffn_norm.weight",
            "self_attn.q_proj.weight" => "attn_q.weight",
            "self_attn.k_proj.weight" => "attn_k.weight",
            "self_attn.v_proj.weight" => "attn_v.weight",
            "self_attn.o_proj.weight" => "attn_output.weight",
            "self_attn.q_proj.bias" => "attn_q.bias",
            "self_attn.k_proj.bias" => "attn_k.bias",
            "self_attn.v_proj.bias" => "attn_v.bias",
            "mlp.gate_proj.weight" => "ffn_gate.weight",
            "mlp.up_proj.weight" => "ffn_up.weight",
            "mlp.down_proj.weight" => "ffn_down.weight",
            _ => return None,
        };
        Some(format!("blk.{layer}.{mapped}"))
    }

    /// HF tensor `hf`: its shape (HF's: out features first) and its values, dequantized, with
    /// the q/k row order of a `llama` file undone.
    pub fn tensor(&self, hf: &str) -> Result<(Vec<u64>, Vec<f32>)> {
        let t = self.info(hf)?;
        let values = self.file.dequantize(t)?;
        let shape: Vec<u64> = t.dims.iter().rev().copied().collect();
        let values = match self.permuted_heads(hf)? {
            Some(heads) => unpermute(&values, shape[0], t.dims[0], heads),
            None => values,
        };
        Ok((shape, values))
    }

    /// HF tensor `hf` as int8 codes in groups of `group` along its rows (the `ggml` weight
    /// format: `scale · code + min` is ggml's value), in HF's row order; `None` for a float
    /// tensor, which holds no codes.
    pub fn tensor_grouped(&self, hf: &str, group: usize) -> Result<Option<quant::Grouped>> {
        let t = self.info(hf)?;
        if t.kind.scale_group().is_none() {
            return Ok(None);
        }
        let n = t.numel() as usize;
        let mut g = quant::grouped(t.kind, self.file.data(t), n, group).map_err(|what| {
            GgufError::Tensor {
                path: self.file.path.clone(),
                tensor: t.name.clone(),
                what,
            }
        })?;
        if let Some(heads) = self.permuted_heads(hf)? {
            let (rows, cols) = (t.rows(), t.dims[0]);
            g.codes = unpermute(&g.codes, rows, cols, heads);
            g.scales = unpermute(&g.scales, rows, cols / group as u64, heads);
            g.mins = unpermute(&g.mins, rows, cols / group as u64, heads);
        }
        Ok(Some(g))
    }

    /// The type the file holds HF tensor `hf` in.
    pub fn tensor_kind(&self, hf: &str) -> Result<crate::TensorType> {
        Ok(self.info(hf)?.kind)
    }

    /// The group (32, or 16 when a tensor is Q6_K) that holds every quantized tensor of the
    /// file in the `ggml` weight format.
    pub fn group(&self) -> usize {
        let kinds = self.file.tensors.iter().map(|t| t.kind);
        kinds.filter_map(|k| k.scale_group()).min().unwrap_or(32)
    }

    fn info(&self, hf: &str) -> Result<&crate::TensorInfo> {
        let name = self.gguf_name(hf).ok_or_else(|| GgufError::Tensor {
            path: self.file.path.clone(),
            tensor: hf.into(),
            what: "has no GGUF counterpart in this mapping".into(),
        })?;
        self.file.tensor(&name)
    }

    /// The heads whose q/k rows a `llama` file stores in llama.cpp's rotary order, if `hf` is
    /// such a tensor.
    fn permuted_heads(&self, hf: &str) -> Result<Option<u64>> {
        if self.arch != "llama" {
            return Ok(None);
        }
        let heads = self.file.u64(&self.key("attention.head_count"));
        if hf.ends_with("q_proj.weight") || hf.ends_with("q_proj.bias") {
            Ok(Some(heads?))
        } else if hf.ends_with("k_proj.weight") || hf.ends_with("k_proj.bias") {
            let heads = heads?;
            Ok(Some(
                self.file
                    .u64(&self.key("attention.head_count_kv"))
                    .unwrap_or(heads),
            ))
        } else {
            Ok(None)
        }
    }
}

/// Rows `rows` (each of `cols` values) in `heads` heads: GGUF's row `2i + p` of a head is HF's row
/// `p · half + i` (`half` = head size / 2), the inverse of llama.cpp's `permute`.
fn unpermute<T: Copy + Default>(values: &[T], rows: u64, cols: u64, heads: u64) -> Vec<T> {
    let (rows, cols) = (rows as usize, cols as usize);
    let head = rows / heads as usize;
    let half = head / 2;
    let mut out = vec![T::default(); values.len()];
    for h in 0..heads as usize {
        for i in 0..half {
            for p in 0..2 {
                let src = h * head + 2 * i + p;
                let dst = h * head + p * half + i;
                out[dst * cols..(dst + 1) * cols]
                    .copy_from_slice(&values[src * cols..(src + 1) * cols]);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::unpermute;

    #[test]
    fn unpermute_inverts_llama_cpps_row_order() {
        // One head of 4 rows, one column: llama.cpp stores HF rows [0, 2, 1, 3] (pairs of the
        // first and second halves interleaved).
        assert_eq!(
            unpermute(&[0.0, 2.0, 1.0, 3.0], 4, 1, 1),
            [0.0, 1.0, 2.0, 3.0]
        );
        // Two heads of 2 rows, two columns: each head alone.
        let two = unpermute(&[0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5], 4, 2, 2);
        assert_eq!(two, [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5]);
    }
}
