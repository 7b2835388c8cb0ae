//! The chat template renderer of a crate that chats (`serve::ChatTemplate`, minijinja as
//! Hugging Face configures Jinja2) on arbitrary input: a template's source, then optionally a
//! line `---` and the messages as JSON (a fixed conversation otherwise). Compiling and rendering
//! must return text or an error, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::{Map, Value, json};
use stories260k_chat_cpu_f32::serve::ChatTemplate;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let (source, messages) = text.split_once("\n---\n").unwrap_or((text, ""));
    let messages: Value = serde_json::from_str(messages).unwrap_or_else(|_| {
        json!([
            { "role": "system", "content": "Be brief." },
            { "role": "user", "content": "Hi" },
            { "role": "assistant", "content": "Hello." },
            { "role": "user", "content": "Bye" },
        ])
    });
    if let Ok(template) = ChatTemplate::new(source.to_string(), "<s>".into(), "</s>".into()) {
        let _ = template.render_with(&messages, true, &Map::new());
        let _ = template.render_with(&messages, false, &Map::new());
    }
});
