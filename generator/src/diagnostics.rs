//! Errors that point into a file: a message, the offending span underlined, and a hint.
//!
//! Every rejection of user input (a workload, an implementation manifest, a kernel source)
//! is a [`Diagnostic`]. It renders in the style of rustc and cargo through annotate-snippets,
//! with `path:line:column`, and has a one-line form for logs and JSON.

use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use annotate_snippets::{AnnotationKind, Group, Level, Origin, Renderer, Snippet};

/// A labelled span inside the diagnostic's source text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Label {
    pub span: Range<usize>,
    pub text: String,
    pub primary: bool,
}

/// One problem with one input file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    pub message: String,
    pub path: Option<PathBuf>,
    pub source: Option<Arc<str>>,
    pub labels: Vec<Label>,
    pub hint: Option<String>,
    pub notes: Vec<String>,
}

impl Diagnostic {
    pub fn new(message: impl Into<String>) -> Diagnostic {
        Diagnostic {
            message: message.into(),
            path: None,
            source: None,
            labels: Vec::new(),
            hint: None,
            notes: Vec::new(),
        }
    }

    /// Attaches the file the spans point into.
    pub fn in_file(mut self, path: &Path, source: &Arc<str>) -> Diagnostic {
        self.path = Some(path.to_path_buf());
        self.source = Some(source.clone());
        self
    }

    /// Attaches only a path (for problems with no span, such as an unreadable file).
    pub fn at_path(mut self, path: &Path) -> Diagnostic {
        self.path = Some(path.to_path_buf());
        self
    }

    pub fn primary(mut self, span: Range<usize>, text: impl Into<String>) -> Diagnostic {
        self.labels.push(Label { span, text: text.into(), primary: true });
        self
    }

    pub fn secondary(mut self, span: Range<usize>, text: impl Into<String>) -> Diagnostic {
        self.labels.push(Label { span, text: text.into(), primary: false });
        self
    }

    pub fn hint(mut self, hint: impl Into<String>) -> Diagnostic {
        self.hint = Some(hint.into());
        self
    }

    pub fn note(mut self, note: impl Into<String>) -> Diagnostic {
        self.notes.push(note.into());
        self
    }

    /// `path:line:column` of the primary label (1-based), or just the path.
    pub fn location(&self) -> Option<String> {
        let path = self.path.as_ref()?;
        let (Some(source), Some(label)) = (&self.source, self.primary_label()) else {
            return Some(path.display().to_string());
        };
        let (line, column) = line_column(source, label.span.start);
        Some(format!("{}:{line}:{column}", path.display()))
    }

    fn primary_label(&self) -> Option<&Label> {
        self.labels.iter().find(|l| l.primary).or(self.labels.first())
    }

    /// The full rustc-style rendering, without colours (deterministic, for files and tests).
    pub fn render(&self) -> String {
        self.render_with(Renderer::plain())
    }

    /// The rendering with ANSI colours, for terminals.
    pub fn render_styled(&self) -> String {
        self.render_with(Renderer::styled())
    }

    fn render_with(&self, renderer: Renderer) -> String {
        let path = self.path.as_ref().map(|p| p.display().to_string());
        let mut error = Group::with_title(Level::ERROR.primary_title(self.message.as_str()));
        match (&self.source, &path) {
            (Some(source), Some(path)) if !self.labels.is_empty() => {
                let mut snippet = Snippet::source(&**source).path(path.as_str()).fold(true);
                for label in &self.labels {
                    let span = clamp_span(source, &label.span);
                    let kind = if label.primary { AnnotationKind::Primary } else { AnnotationKind::Context };
                    snippet = snippet.annotation(kind.span(span).label(label.text.as_str()));
                }
                error = error.element(snippet);
            }
            (_, Some(path)) => error = error.element(Origin::path(path.as_str())),
            _ => {}
        }
        let mut groups = vec![error];
        for note in &self.notes {
            groups.push(Group::with_title(Level::NOTE.secondary_title(note.as_str())));
        }
        if let Some(hint) = &self.hint {
            groups.push(Group::with_title(Level::HELP.secondary_title(hint.as_str())));
        }
        renderer.render(&groups).to_string()
    }
}

/// The one-line form: `path:line:column: message (hint: ...)`.
impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(location) = self.location() {
            write!(f, "{location}: ")?;
        }
        write!(f, "{}", self.message)?;
        if let Some(label) = self.primary_label().filter(|l| !l.text.is_empty()) {
            write!(f, ": {}", label.text)?;
        }
        if let Some(hint) = &self.hint {
            write!(f, " (hint: {hint})")?;
        }
        Ok(())
    }
}

/// 1-based line and column (in characters) of a byte offset.
pub fn line_column(source: &str, offset: usize) -> (usize, usize) {
    let offset = floor_char_boundary(source, offset.min(source.len()));
    let before = &source[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = source[line_start..offset].chars().count() + 1;
    (line, column)
}

/// Byte offset of a 1-based line and column (column in characters).
pub fn offset_of(source: &str, line: usize, column: usize) -> usize {
    let line_start: usize = source.split_inclusive('\n').take(line.saturating_sub(1)).map(str::len).sum();
    let line_text = source[line_start.min(source.len())..].lines().next().unwrap_or("");
    line_start + line_text.char_indices().nth(column.saturating_sub(1)).map_or(line_text.len(), |(i, _)| i)
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn clamp_span(source: &str, span: &Range<usize>) -> Range<usize> {
    let start = floor_char_boundary(source, span.start.min(source.len()));
    let end = floor_char_boundary(source, span.end.min(source.len())).max(start);
    start..end
}

/// The candidate closest to `word` by edit distance, if it is close enough to be a likely typo.
pub fn nearest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|c| (strsim::damerau_levenshtein(word, c), c))
        .filter(|(d, c)| *d <= 2.max(c.len() / 3))
        .min()
        .map(|(_, c)| c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_and_column_are_one_based() {
        let s = "a = 1\nbb = 2\n";
        assert_eq!(line_column(s, 0), (1, 1));
        assert_eq!(line_column(s, 6), (2, 1));
        assert_eq!(line_column(s, 11), (2, 6));
    }

    #[test]
    fn render_names_file_line_and_column() {
        let src: Arc<str> = Arc::from("x = 1\nnum_heads = 7\n");
        let d = Diagnostic::new("bad value")
            .in_file(Path::new("w.toml"), &src)
            .primary(18..19, "here")
            .hint("use 8");
        let text = d.render();
        assert!(text.contains("w.toml:2:13"), "{text}");
        assert!(text.contains("help: use 8"), "{text}");
        assert_eq!(d.to_string(), "w.toml:2:13: bad value: here (hint: use 8)");
    }

    #[test]
    fn nearest_finds_typos_only() {
        let keys = ["hidden_size", "head_dim", "num_heads"];
        assert_eq!(nearest("hiden_size", keys), Some("hidden_size"));
        assert_eq!(nearest("num_head", keys), Some("num_heads"));
        assert_eq!(nearest("completely_else", keys), None);
    }
}
