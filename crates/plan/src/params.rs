//! The parameter tensors of a model, by HF name, and exact parameter counts.
//!
//! Holds the tensor list of the embedding, of each block (dense or MoE, MHA/GQA or MLA) and of the
//! head, with the facts the memory model needs: element count, whether tensor parallelism splits
//! it, whether it is a linear layer (quantizable, a LoRA target). It does not hold dtypes or
//! sharding; the runtime profiles decide those.
//! Example: `presets::by_name("llama2-7b")?.param_count()` is 6,738,415,616.

use crate::model::{Family, ModelShape};

/// What a parameter tensor is, which decides whether formats and LoRA apply to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorKind {
    /// Token or position embedding table: never quantized, vocab-parallel under TP.
    Embedding,
    /// A linear layer's weight matrix: quantizable, a LoRA target.
    Linear,
    /// A bias vector.
    Bias,
    /// LayerNorm/RMSNorm scale (and shift).
    Norm,
    /// The MoE router's weight (kept in 16 bits by quantizers).
    Router,
}

/// One parameter tensor (or `count` identical ones, for experts).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tensor {
    /// HF module name suffix (`q_proj`, `c_attn`, `experts.w1`, `input_layernorm`).
    pub name: &'static str,
    pub kind: TensorKind,
    /// Input features (1 for vectors).
    pub d_in: u64,
    /// Output features (vector length for vectors).
    pub d_out: u64,
    /// Identical copies (routed experts); 1 otherwise.
    pub count: u64,
    /// Tensor parallelism splits this tensor over the TP ranks (Megatron column/row parallel).
    pub tp_split: bool,
}

impl Tensor {
    pub fn numel(&self) -> u64 {
        self.d_in * self.d_out * self.count
    }

    fn linear(name: &'static str, d_in: u64, d_out: u64) -> Tensor {
        Tensor {
            name,
            kind: TensorKind::Linear,
            d_in,
            d_out,
            count: 1,
            tp_split: true,
        }
    }

    fn vector(name: &'static str, kind: TensorKind, len: u64, tp_split: bool) -> Tensor {
        Tensor {
            name,
            kind,
            d_in: 1,
            d_out: len,
            count: 1,
            tp_split,
        }
    }

    fn experts(self, count: u64) -> Tensor {
        Tensor { count, ..self }
    }
}

impl ModelShape {
    /// Whether block `layer_idx` has a mixture-of-experts MLP.
    pub fn is_moe_layer(&self, layer_idx: u32) -> bool {
        self.moe
            .as_ref()
            .is_some_and(|m| layer_idx >= m.first_dense)
    }

    /// Parameter tensors of the embedding (token table, and learned positions for GPT-2).
    pub fn embedding_tensors(&self) -> Vec<Tensor> {
        let mut t = vec![Tensor {
            name: "embed_tokens",
            kind: TensorKind::Embedding,
            d_in: self.vocab,
            d_out: self.d_model,
            count: 1,
            tp_split: true,
        }];
        if self.family == Family::Gpt2 {
            t.push(Tensor {
                name: "wpe",
                kind: TensorKind::Embedding,
                d_in: self.max_positions,
                d_out: self.d_model,
                count: 1,
                tp_split: false,
            });
        }
        t
    }

    /// Parameter tensors after the last block: the final norm, and the output projection unless
    /// it is tied to the token embedding.
    pub fn head_tensors(&self) -> Vec<Tensor> {
        let mut t = vec![Tensor::vector(
            "norm",
            TensorKind::Norm,
            self.d_model,
            false,
        )];
        if self.family == Family::Gpt2 {
            t.push(Tensor::vector(
                "norm.bias",
                TensorKind::Norm,
                self.d_model,
                false,
            ));
        }
        if !self.tied_embeddings {
            t.push(Tensor {
                kind: TensorKind::Embedding,
                ..Tensor::linear("lm_head", self.d_model, self.vocab)
            });
        }
        t
    }

    /// Parameter tensors of block `layer_idx`.
    pub fn block_tensors(&self, layer_idx: u32) -> Vec<Tensor> {
        let mut t = Vec::with_capacity(16);
        match self.family {
            Family::Gpt2 => self.gpt2_block(&mut t),
            _ => {
                let norm = |name| Tensor::vector(name, TensorKind::Norm, self.d_model, false);
                t.push(norm("input_layernorm"));
                if self.mla.is_some() {
                    self.mla_attention(&mut t);
                } else {
                    self.gqa_attention(&mut t);
                }
                t.push(norm("post_attention_layernorm"));
                if self.is_moe_layer(layer_idx) {
                    self.moe_mlp(&mut t);
                } else {
                    self.swiglu("", self.d_ff, &mut t);
                }
            }
        }
        t
    }

    fn gpt2_block(&self, t: &mut Vec<Tensor>) {
        let c = self.d_model;
        let ln = |name| Tensor::vector(name, TensorKind::Norm, c, false);
        t.extend([ln("ln_1.weight"), ln("ln_1.bias")]);
        t.push(Tensor::linear("c_attn", c, 3 * c));
        t.push(Tensor::vector("c_attn.bias", TensorKind::Bias, 3 * c, true));
        t.push(Tensor::linear("attn.c_proj", c, c));
        t.push(Tensor::vector(
            "attn.c_proj.bias",
            TensorKind::Bias,
            c,
            false,
        ));
        t.extend([ln("ln_2.weight"), ln("ln_2.bias")]);
        t.push(Tensor::linear("c_fc", c, self.d_ff));
        t.push(Tensor::vector(
            "c_fc.bias",
            TensorKind::Bias,
            self.d_ff,
            true,
        ));
        t.push(Tensor::linear("mlp.c_proj", self.d_ff, c));
        t.push(Tensor::vector(
            "mlp.c_proj.bias",
            TensorKind::Bias,
            c,
            false,
        ));
    }

    fn gqa_attention(&self, t: &mut Vec<Tensor>) {
        let q = self.n_heads as u64 * self.d_head;
        let kv = self.n_kv_heads as u64 * self.d_head;
        t.push(Tensor::linear("q_proj", self.d_model, q));
        t.push(Tensor::linear("k_proj", self.d_model, kv));
        t.push(Tensor::linear("v_proj", self.d_model, kv));
        if self.family == Family::Qwen2 {
            t.push(Tensor::vector("q_proj.bias", TensorKind::Bias, q, true));
            t.push(Tensor::vector("k_proj.bias", TensorKind::Bias, kv, true));
            t.push(Tensor::vector("v_proj.bias", TensorKind::Bias, kv, true));
        }
        t.push(Tensor::linear("o_proj", q, self.d_model));
    }

    fn mla_attention(&self, t: &mut Vec<Tensor>) {
        let m = self.mla.as_ref().expect("MLA shape");
        let heads = self.n_heads as u64;
        let q_head = m.qk_nope_head_dim + m.qk_rope_head_dim;
        match m.q_lora_rank {
            Some(r) => {
                t.push(Tensor {
                    tp_split: false,
                    ..Tensor::linear("q_a_proj", self.d_model, r)
                });
                t.push(Tensor::vector("q_a_layernorm", TensorKind::Norm, r, false));
                t.push(Tensor::linear("q_b_proj", r, heads * q_head));
            }
            None => t.push(Tensor::linear("q_proj", self.d_model, heads * q_head)),
        }
        // The compressed latent and the shared RoPE key are computed once, replicated over TP.
        t.push(Tensor {
            tp_split: false,
            ..Tensor::linear(
                "kv_a_proj_with_mqa",
                self.d_model,
                m.kv_lora_rank + m.qk_rope_head_dim,
            )
        });
        t.push(Tensor::vector(
            "kv_a_layernorm",
            TensorKind::Norm,
            m.kv_lora_rank,
            false,
        ));
        t.push(Tensor::linear(
            "kv_b_proj",
            m.kv_lora_rank,
            heads * (m.qk_nope_head_dim + m.v_head_dim),
        ));
        t.push(Tensor::linear("o_proj", heads * m.v_head_dim, self.d_model));
    }

    fn swiglu(&self, prefix: &'static str, d_ff: u64, t: &mut Vec<Tensor>) {
        let names: [&'static str; 3] = match prefix {
            "experts" => ["experts.gate_proj", "experts.up_proj", "experts.down_proj"],
            "shared" => [
                "shared_experts.gate_proj",
                "shared_experts.up_proj",
                "shared_experts.down_proj",
            ],
            _ => ["gate_proj", "up_proj", "down_proj"],
        };
        t.push(Tensor::linear(names[0], self.d_model, d_ff));
        t.push(Tensor::linear(names[1], self.d_model, d_ff));
        t.push(Tensor::linear(names[2], d_ff, self.d_model));
    }

    fn moe_mlp(&self, t: &mut Vec<Tensor>) {
        let m = self.moe.as_ref().expect("MoE shape");
        t.push(Tensor {
            kind: TensorKind::Router,
            tp_split: false,
            ..Tensor::linear("gate", self.d_model, m.n_experts as u64)
        });
        if self.family == Family::Deepseek && m.router_bias {
            t.push(Tensor::vector(
                "gate.e_score_correction_bias",
                TensorKind::Router,
                m.n_experts as u64,
                false,
            ));
        }
        let start = t.len();
        if self.family == Family::Mixtral {
            t.push(Tensor::linear("w1", self.d_model, m.d_ff_expert));
            t.push(Tensor::linear("w3", self.d_model, m.d_ff_expert));
            t.push(Tensor::linear("w2", m.d_ff_expert, self.d_model));
        } else {
            self.swiglu("experts", m.d_ff_expert, t);
        }
        for e in &mut t[start..] {
            *e = e.experts(m.n_experts as u64);
        }
        if m.n_shared > 0 {
            self.swiglu("shared", m.d_ff_expert * m.n_shared as u64, t);
        }
    }

    /// Parameters of block `layer_idx`.
    pub fn block_params(&self, layer_idx: u32) -> u64 {
        self.block_tensors(layer_idx)
            .iter()
            .map(Tensor::numel)
            .sum()
    }

    pub fn embedding_params(&self) -> u64 {
        self.embedding_tensors().iter().map(Tensor::numel).sum()
    }

    pub fn head_params(&self) -> u64 {
        self.head_tensors().iter().map(Tensor::numel).sum()
    }

    /// Every parameter, tied embeddings counted once (what HF's `num_parameters()` reports).
    pub fn param_count(&self) -> u64 {
        let blocks: u64 = match &self.moe {
            Some(m) if m.first_dense < self.n_layers => {
                let dense = m.first_dense as u64 * self.block_params(0);
                dense + (self.n_layers - m.first_dense) as u64 * self.block_params(m.first_dense)
            }
            _ => self.n_layers as u64 * self.block_params(0),
        };
        self.embedding_params() + blocks + self.head_params()
    }

    /// The largest single module by its own parameters (DeepSpeed's `largest_layer_params`: a
    /// module's weights without its children's; one expert's matrix, not the stacked experts).
    pub fn largest_module(&self) -> (&'static str, u64) {
        let mut best = ("", 0);
        let mut consider = |tensors: Vec<Tensor>| {
            for t in tensors {
                let one = t.d_in * t.d_out;
                if one > best.1 {
                    best = (t.name, one);
                }
            }
        };
        consider(self.embedding_tensors());
        consider(self.head_tensors());
        consider(self.block_tensors(0));
        if let Some(m) = &self.moe {
            consider(self.block_tensors(m.first_dense));
        }
        best
    }

    /// The largest unit the model is split into for loading and ZeRO-3 gathers: the embedding,
    /// one block, or the final norm with the head (accelerate's "largest layer", its
    /// no-split modules). Returns its name (`embed`, `block`, `head`) and parameters.
    pub fn largest_unit(&self) -> (&'static str, u64) {
        let dense = self.block_params(0);
        let block = self
            .moe
            .as_ref()
            .map_or(dense, |m| dense.max(self.block_params(m.first_dense)));
        let units = [
            ("embed", self.embedding_params()),
            ("block", block),
            ("head", self.head_params()),
        ];
        units
            .into_iter()
            .fold(("", 0), |a, b| if b.1 > a.1 { b } else { a })
    }

    /// Parameters a token actually uses in a forward pass (top-k experts, not all of them).
    pub fn active_param_count(&self) -> u64 {
        let Some(m) = &self.moe else {
            return self.param_count();
        };
        let idle_experts = (m.n_experts - m.n_active) as u64;
        let per_expert = 3 * self.d_model * m.d_ff_expert;
        let moe_layers = self.n_layers.saturating_sub(m.first_dense) as u64;
        self.param_count() - moe_layers * idle_experts * per_expert
    }
}
