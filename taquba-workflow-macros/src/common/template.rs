//! Key templates: `#[job(key = "email:{to}")]`.

/// One piece of a key template.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Piece {
    /// Literal text (braces already unescaped).
    Text(String),
    /// `{field}` or `{field:spec}`.
    Field { name: String, spec: String },
}

/// Parses `"email:{to}:{subject}"`; `{{` and `}}` are literal braces.
pub(crate) fn parse_template(template: &str) -> Result<Vec<Piece>, String> {
    let mut pieces = Vec::new();
    let mut text = String::new();
    let mut chars = template.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                text.push('{');
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                text.push('}');
            }
            '}' => {
                return Err(
                    "unmatched `}` in the key template: write `}}` for a literal brace".into(),
                );
            }
            '{' => {
                let mut inner = String::new();
                loop {
                    match chars.next() {
                        Some('}') => break,
                        Some(c) => inner.push(c),
                        None => {
                            return Err("unclosed `{` in the key template: write `{field}`, or `{{` for a literal brace".into());
                        }
                    }
                }
                let (name, spec) = match inner.split_once(':') {
                    Some((name, spec)) => (name.trim().to_string(), spec.to_string()),
                    None => (inner.trim().to_string(), String::new()),
                };
                if name.is_empty() {
                    return Err(
                        "`{}` in the key template must name a parameter: write `{to}`".into(),
                    );
                }
                if !text.is_empty() {
                    pieces.push(Piece::Text(std::mem::take(&mut text)));
                }
                pieces.push(Piece::Field { name, spec });
            }
            c => text.push(c),
        }
    }
    if !text.is_empty() {
        pieces.push(Piece::Text(text));
    }
    Ok(pieces)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_parse_fields_specs_and_escapes() {
        assert_eq!(
            parse_template("email:{to}:{{x}}{n:>3}").unwrap(),
            vec![
                Piece::Text("email:".into()),
                Piece::Field {
                    name: "to".into(),
                    spec: String::new()
                },
                Piece::Text(":{x}".into()),
                Piece::Field {
                    name: "n".into(),
                    spec: ">3".into()
                },
            ]
        );
        assert!(parse_template("a{").is_err());
        assert!(parse_template("a}").is_err());
        assert!(parse_template("{}").is_err());
    }
}
