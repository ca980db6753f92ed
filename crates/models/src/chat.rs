//! Chat prompts: a model's chat template (Jinja, from its GGUF file or tokenizer_config.json)
//! rendered with `minijinja` as transformers' `apply_chat_template` renders it: `messages`,
//! `add_generation_prompt`, `bos_token` and `eos_token`, Python's string methods available.
//!
//! Example: `chat::render(&tok, Some("Be brief."), "What is 2 + 2?")?` ends with
//! `<|im_start|>assistant\n` for a ChatML template.

use anyhow::{anyhow, bail};
use minijinja::{context, Environment};

/// The prompt text of one user `message` (after an optional `system` one), ending where the
/// assistant's answer starts.
pub fn render(
    tok: &data::Tokenizer,
    system: Option<&str>,
    message: &str,
) -> anyhow::Result<String> {
    let mut turns = Vec::new();
    if let Some(s) = system {
        turns.push(("system".to_string(), s.to_string()));
    }
    turns.push(("user".to_string(), message.to_string()));
    render_messages(tok, &turns)
}

/// The prompt text of a conversation, `(role, content)` turn by turn, ending where the
/// assistant's answer starts.
pub fn render_messages(
    tok: &data::Tokenizer,
    turns: &[(String, String)],
) -> anyhow::Result<String> {
    let Some(template) = tok.chat_template() else {
        bail!(
            "the model ships no chat template (neither its GGUF file nor its \
             tokenizer_config.json has one)"
        );
    };
    let mut env = Environment::new();
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function(
        "raise_exception",
        |text: String| -> Result<String, minijinja::Error> {
            Err(minijinja::Error::new(
                minijinja::ErrorKind::InvalidOperation,
                text,
            ))
        },
    );
    env.add_template("chat", template)
        .map_err(|e| anyhow!("the model's chat template does not parse: {e}"))?;
    let messages: Vec<_> = turns
        .iter()
        .map(|(role, content)| context! { role => role, content => content })
        .collect();
    let name = |id: Option<u32>| id.and_then(|i| tok.token_text(i)).unwrap_or_default();
    let ctx = context! {
        messages => messages,
        add_generation_prompt => true,
        bos_token => name(tok.bos()),
        eos_token => name(tok.eos()),
    };
    env.get_template("chat")
        .and_then(|t| t.render(ctx))
        .map_err(|e| anyhow!("the model's chat template fails to render: {e}"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_prompt_without_a_template_is_refused_saying_what_to_do() {
        let err = super::render(&data::Tokenizer::gpt2(), None, "hi").unwrap_err();
        assert!(err.to_string().contains("no chat template"), "{err}");
    }
}
