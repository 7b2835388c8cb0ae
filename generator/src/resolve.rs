//! Resolution: workload + registry → [`Plan`].
//!
//! For each interface the architecture needs, every implementation is checked against the
//! workload's constraints (device, arch, CPU features, dtype, shapes), and each failed check
//! is kept as a reason. Among the compatible ones, shadowing removes those that another
//! compatible implementation declares it replaces; the rest are ranked by declared priority
//! (then by name, so that the result never depends on file-system order). Resolution is
//! the only stage that rejects a workload for semantic reasons beyond its own file.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::cpu;
use crate::diagnostics::Diagnostic;
use crate::plan::{Candidate, Chosen, Consts, Footprint, InterfacePlan, Plan, Verdict};
use crate::registry::{Implementation, Registry, sha256_hex};
use crate::workload::{Architecture, Workload};

/// The interfaces an architecture's forward pass calls, in the order it calls them.
pub fn required_interfaces(architecture: Architecture) -> &'static [&'static str] {
    match architecture {
        Architecture::Llama => &[
            "rmsnorm",
            "matmul",
            "rope",
            "kv_cache",
            "attention_prefill",
            "attention_decode",
            "swiglu",
            "sampler",
        ],
    }
}

/// The values of the shape parameters that manifests constrain.
pub fn shape_parameters(w: &Workload) -> BTreeMap<&'static str, usize> {
    let m = w.llama();
    BTreeMap::from([
        ("hidden_size", m.hidden_size),
        ("intermediate_size", m.intermediate_size),
        ("num_layers", m.num_layers),
        ("num_heads", m.num_heads),
        ("num_kv_heads", m.num_kv_heads),
        ("head_dim", m.head_dim),
        ("vocab_size", m.vocab_size),
        ("max_seq_len", w.request.max_seq_len),
    ])
}

/// Why `imp` cannot serve `w`; empty when it can.
pub fn rejections(imp: &Implementation, w: &Workload) -> Vec<String> {
    let c = &imp.constraints;
    let mut reasons = Vec::new();
    if let Some(devices) = &c.devices
        && !devices.contains(&w.target.device)
    {
        let list: Vec<&str> = devices.iter().map(|d| d.as_str()).collect();
        reasons.push(format!(
            "runs on {}; the workload targets {} (target.device)",
            list.join(", "),
            w.target.device.as_str()
        ));
    }
    if let Some(arches) = &c.arches
        && !arches.contains(&w.target.arch)
    {
        reasons.push(format!(
            "compiles for {} only; the workload targets {} (target.arch)",
            arches.join(", "),
            w.target.arch
        ));
    }
    let missing: Vec<&str> =
        c.cpu_features.iter().filter(|f| !w.target.cpu_features.contains(f)).map(String::as_str).collect();
    if !missing.is_empty() {
        reasons.push(format!(
            "needs CPU feature{} {}, which target.cpu_features does not list",
            if missing.len() == 1 { "" } else { "s" },
            missing.join(", ")
        ));
    }
    if let Some(dtypes) = &c.dtypes
        && !dtypes.contains(&w.weights.dtype)
    {
        let list: Vec<&str> = dtypes.iter().map(|d| d.as_str()).collect();
        reasons.push(format!(
            "supports weight dtype {}; the workload uses {} (weights.dtype)",
            list.join(", "),
            w.weights.dtype.as_str()
        ));
    }
    let shapes = shape_parameters(w);
    for (name, bound) in &c.shapes {
        if let Some(&value) = shapes.get(name.as_str())
            && let Some(why) = bound.violation(value)
        {
            reasons.push(format!("needs {name} {}: the workload's {name} {why}", describe_bound(bound)));
        }
    }
    reasons
}

fn describe_bound(b: &crate::registry::ShapeBound) -> String {
    let mut parts = Vec::new();
    if let Some(m) = b.min {
        parts.push(format!(">= {m}"));
    }
    if let Some(m) = b.max {
        parts.push(format!("<= {m}"));
    }
    if let Some(m) = b.multiple_of {
        parts.push(format!("a multiple of {m}"));
    }
    parts.join(", ")
}

/// Resolves `w` against `registry`. `path` is the workload file, for error messages.
pub fn resolve(w: &Workload, registry: &Registry, path: &Path) -> Result<Plan, Vec<Diagnostic>> {
    let mut problems = Vec::new();
    let mut interfaces = Vec::new();
    for &name in required_interfaces(w.model.architecture()) {
        let Some(interface) = registry.interfaces.get(name) else {
            problems.push(
                Diagnostic::new(format!(
                    "the registry has no interface `{name}`, which the {} architecture needs",
                    w.model.architecture().as_str()
                ))
                .hint(format!("add interfaces/{name}.toml")),
            );
            continue;
        };
        match choose(name, registry.implementations_of(name), w) {
            Ok((chosen, candidates)) => interfaces.push(InterfacePlan {
                interface: name.to_string(),
                summary: interface.summary.clone(),
                chosen,
                candidates,
            }),
            Err(candidates) => {
                let mut d =
                    Diagnostic::new(format!("no implementation of `{name}` fits workload `{}`", w.name))
                        .at_path(path);
                if candidates.is_empty() {
                    d = d.note(format!("implementations/{name}/ holds no implementation"));
                }
                for c in &candidates {
                    if let Verdict::Rejected { reasons } = &c.verdict {
                        d = d.note(format!("{name}/{}: {}", c.name, reasons.join("; ")));
                    }
                }
                problems.push(d.hint("change the workload's target or dtype, or add an implementation that supports it (see `monogen explain`)"));
            }
        }
    }
    if !problems.is_empty() {
        return Err(problems);
    }

    let cpu_features: BTreeSet<&str> =
        interfaces.iter().flat_map(|i| i.chosen.cpu_features.iter().map(String::as_str)).collect();
    let cpu_features: Vec<String> =
        cpu::X86_64_FEATURES.iter().filter(|f| cpu_features.contains(*f)).map(|f| f.to_string()).collect();
    let shared_modules: BTreeSet<String> =
        interfaces.iter().flat_map(|i| i.chosen.shared.iter().cloned()).collect();
    let consts = consts(w);
    let footprint = footprint(w, &consts);
    Ok(Plan {
        workload: w.clone(),
        workload_sha256: sha256_hex(w.canonical_toml().as_bytes()),
        consts,
        interfaces,
        cpu_features,
        shared_modules: shared_modules.into_iter().collect(),
        footprint,
    })
}

/// Picks one implementation; on failure returns every candidate with its verdict.
fn choose(
    interface: &str,
    imps: &[Implementation],
    w: &Workload,
) -> Result<(Chosen, Vec<Candidate>), Vec<Candidate>> {
    let reasons: Vec<Vec<String>> = imps.iter().map(|i| rejections(i, w)).collect();
    let compatible: Vec<&Implementation> =
        imps.iter().zip(&reasons).filter(|(_, r)| r.is_empty()).map(|(i, _)| i).collect();
    let shadowed_by = |imp: &Implementation| {
        compatible.iter().find(|other| other.shadows.contains(&imp.name)).map(|o| o.name.clone())
    };
    let mut ranked: Vec<&Implementation> =
        compatible.iter().copied().filter(|i| shadowed_by(i).is_none()).collect();
    ranked.sort_by(|a, b| b.priority.cmp(&a.priority).then_with(|| a.name.cmp(&b.name)));

    let winner = ranked.first().copied();
    let reason = winner.map(|win| {
        let others = ranked.len() - 1;
        if others == 0 {
            if compatible.len() > 1 {
                format!("the only compatible implementation of `{interface}` that no other replaces")
            } else {
                format!("the only implementation of `{interface}` that fits this workload")
            }
        } else {
            format!(
                "highest declared priority ({}) among {} compatible implementations (no measurements yet)",
                win.priority,
                ranked.len()
            )
        }
    });

    let candidates: Vec<Candidate> = imps
        .iter()
        .zip(reasons)
        .map(|(imp, reasons)| {
            let verdict = if !reasons.is_empty() {
                Verdict::Rejected { reasons }
            } else if let Some(by) = shadowed_by(imp) {
                Verdict::Shadowed { by }
            } else if winner.is_some_and(|w| w.name == imp.name) {
                Verdict::Chosen { reason: reason.clone().unwrap_or_default() }
            } else {
                let win = winner.expect("a compatible, unshadowed candidate implies a winner");
                Verdict::Outranked {
                    by: win.name.clone(),
                    reason: format!(
                        "declared priority {} is below {}'s {}",
                        imp.priority, win.name, win.priority
                    ),
                }
            };
            Candidate {
                name: imp.name.clone(),
                version: imp.version.clone(),
                priority: imp.priority,
                verdict,
            }
        })
        .collect();

    match winner {
        Some(win) => Ok((
            Chosen {
                name: win.name.clone(),
                version: win.version.clone(),
                source_sha256: win.source_sha256.clone(),
                cpu_features: win.constraints.cpu_features.clone(),
                shared: win.shared.clone(),
                reason: reason.unwrap_or_default(),
            },
            candidates,
        )),
        None => Err(candidates),
    }
}

fn consts(w: &Workload) -> Consts {
    let m = w.llama();
    Consts {
        dim: m.hidden_size,
        hidden_dim: m.intermediate_size,
        n_layers: m.num_layers,
        n_heads: m.num_heads,
        n_kv_heads: m.num_kv_heads,
        head_dim: m.head_dim,
        q_dim: m.num_heads * m.head_dim,
        kv_dim: m.num_kv_heads * m.head_dim,
        vocab_size: m.vocab_size,
        max_seq_len: w.request.max_seq_len,
        prefill_chunk: w.request.typical_prompt_len.min(w.request.max_seq_len),
        rope_theta: m.rope_theta as f32,
        rms_norm_eps: m.rms_norm_eps as f32,
        bos_id: m.bos_token_id,
        eos_ids: m.eos_token_ids.clone(),
        threads: w.target.threads,
        tie_word_embeddings: m.tie_word_embeddings,
    }
}

fn footprint(w: &Workload, c: &Consts) -> Footprint {
    let (d, h, v, q, kv) =
        (c.dim as u64, c.hidden_dim as u64, c.vocab_size as u64, c.q_dim as u64, c.kv_dim as u64);
    let per_layer = 2 * d + d * q + 2 * d * kv + q * d + 3 * d * h;
    let classifier = if c.tie_word_embeddings { 0 } else { v * d };
    let parameters = v * d + c.n_layers as u64 * per_layer + d + classifier;
    let chunk = c.prefill_chunk as u64;
    let f32_size = 4;
    let kv_cache_bytes = 2 * c.n_layers as u64 * c.max_seq_len as u64 * kv * f32_size;
    // x, xb: [chunk, DIM]; q, att: [chunk, Q_DIM]; k, v: [chunk, KV_DIM]; gate, up: [chunk, HIDDEN_DIM];
    // scores: [MAX_SEQ_LEN]; logits: [VOCAB_SIZE]
    let scratch = chunk * (2 * d + 2 * q + 2 * kv + 2 * h) + c.max_seq_len as u64 + v;
    Footprint {
        parameters,
        weight_bytes: parameters * w.weights.dtype.size() as u64,
        kv_cache_bytes,
        scratch_bytes: scratch * f32_size,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::{Constraints, ShapeBound};
    use crate::workload::{Dtype, WorkloadSource};
    use std::sync::Arc;

    fn workload() -> Workload {
        WorkloadSource::from_text("w.toml", crate::workload::tests_support::GOOD).parse().unwrap()
    }

    fn imp(name: &str, priority: i64, constraints: Constraints, shadows: &[&str]) -> Implementation {
        Implementation {
            interface: "matmul".into(),
            name: name.into(),
            version: "1.0.0".into(),
            summary: String::new(),
            priority,
            shadows: shadows.iter().map(|s| s.to_string()).collect(),
            shared: vec![],
            constraints,
            dir: format!("implementations/matmul/{name}").into(),
            source: Arc::from(""),
            source_sha256: String::new(),
        }
    }

    fn needs(features: &[&str]) -> Constraints {
        Constraints {
            arches: Some(vec!["x86_64".into()]),
            cpu_features: features.iter().map(|s| s.to_string()).collect(),
            ..Constraints::default()
        }
    }

    #[test]
    fn highest_priority_compatible_wins_and_reasons_are_kept() {
        let w = workload();
        let imps = vec![
            imp("avx2", 20, needs(&["avx2", "fma"]), &[]),
            imp("avx512", 30, needs(&["avx512f"]), &[]),
            imp("scalar", 0, Constraints::default(), &[]),
        ];
        let (chosen, candidates) = choose("matmul", &imps, &w).unwrap();
        assert_eq!(chosen.name, "avx2");
        assert!(chosen.reason.contains("highest declared priority (20) among 2"), "{}", chosen.reason);
        assert_eq!(
            candidates[1].verdict,
            Verdict::Rejected {
                reasons: vec!["needs CPU feature avx512f, which target.cpu_features does not list".into()]
            }
        );
        assert!(matches!(&candidates[2].verdict, Verdict::Outranked { by, .. } if by == "avx2"));
    }

    #[test]
    fn shadowing_removes_the_generic_candidate_even_at_higher_priority() {
        let w = workload();
        let imps = vec![
            imp("fast", 1, needs(&["avx2"]), &["generic"]),
            imp("generic", 5, Constraints::default(), &[]),
        ];
        let (chosen, candidates) = choose("matmul", &imps, &w).unwrap();
        assert_eq!(chosen.name, "fast");
        assert_eq!(candidates[1].verdict, Verdict::Shadowed { by: "fast".into() });
    }

    #[test]
    fn a_shadowing_candidate_that_does_not_fit_shadows_nothing() {
        let w = workload();
        let imps = vec![
            imp("fast", 1, needs(&["avx512f"]), &["generic"]),
            imp("generic", 0, Constraints::default(), &[]),
        ];
        let (chosen, _) = choose("matmul", &imps, &w).unwrap();
        assert_eq!(chosen.name, "generic");
    }

    #[test]
    fn dtype_and_shape_constraints_explain_themselves() {
        let mut w = workload();
        w.weights.dtype = Dtype::Bf16;
        let mut c = Constraints { dtypes: Some(vec![Dtype::F32]), ..Constraints::default() };
        c.shapes.insert("head_dim".into(), ShapeBound { multiple_of: Some(16), ..ShapeBound::default() });
        let reasons = rejections(&imp("x", 0, c, &[]), &w);
        assert_eq!(
            reasons,
            [
                "supports weight dtype f32; the workload uses bf16 (weights.dtype)",
                "needs head_dim a multiple of 16: the workload's head_dim is 8, not a multiple of 16",
            ]
        );
        let err = choose(
            "matmul",
            &[imp("x", 0, Constraints { dtypes: Some(vec![Dtype::F32]), ..Constraints::default() }, &[])],
            &w,
        );
        assert!(err.is_err());
    }

    #[test]
    fn footprint_counts_stories260k_parameters() {
        let w = workload();
        let c = consts(&w);
        let f = footprint(&w, &c);
        // 512·64 embedding + 5 layers · (2·64 + 64·64 + 2·64·32 + 64·64 + 3·64·172) + 64
        assert_eq!(f.parameters, 32768 + 5 * (128 + 4096 + 4096 + 4096 + 33024) + 64);
        assert_eq!(f.kv_cache_bytes, 2 * 5 * 512 * 32 * 4);
    }
}
