//! Version 1's `gen`: references made by iterating over dimensions. Each entry names a key and a
//! URL (and perhaps an offset and a length) as templates with `{{ expression }}` parts, and
//! dimensions as ranges (`{"start", "stop", "step"}`) or lists; one reference is made for each
//! combination of the dimensions' values, the last dimension varying fastest (fsspec's
//! `itertools.product`). Expressions are what kerchunk's spec shows: names (dimensions and
//! templates), whole numbers, `+ - * // %` and parentheses; jinja's other forms are refused.

use serde_json::{Map, Value};

use super::{RefError, Reference, Result, Urls, bad};

/// The most references one file may generate: more is taken for damage, not a reference set.
pub const MAX_GENERATED: u64 = 10_000_000;

/// A value a name stands for.
#[derive(Debug, Clone, PartialEq)]
enum Term {
    Int(i64),
    Text(String),
}

impl std::fmt::Display for Term {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Term::Int(n) => write!(f, "{n}"),
            Term::Text(text) => f.write_str(text),
        }
    }
}

/// The references of every `gen` entry, in order.
pub fn expand(entries: &[Value], templates: &Map<String, Value>, urls: &mut Urls) -> Result<Vec<(String, Reference)>> {
    let mut refs = Vec::new();
    for (n, entry) in entries.iter().enumerate() {
        expand_one(entry, templates, urls, &mut refs).map_err(|e| bad(format!("gen entry {n}: {e}")))?;
    }
    Ok(refs)
}

fn expand_one(
    entry: &Value,
    templates: &Map<String, Value>,
    urls: &mut Urls,
    refs: &mut Vec<(String, Reference)>,
) -> Result<()> {
    let text = |field: &str| -> Result<Option<String>> {
        match entry.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(text)) => Ok(Some(text.clone())),
            Some(Value::Number(n)) => Ok(Some(n.to_string())),
            Some(_) => Err(bad(format!("\"{field}\" is not a string"))),
        }
    };
    let key = text("key")?.ok_or_else(|| bad("no \"key\""))?;
    let url = text("url")?.ok_or_else(|| bad("no \"url\""))?;
    let (offset, length) = (text("offset")?, text("length")?);
    if offset.is_some() != length.is_some() {
        return Err(bad("an offset without a length, or a length without an offset"));
    }
    let Some(Value::Object(dimensions)) = entry.get("dimensions") else {
        return Err(bad("\"dimensions\" is not a JSON object"));
    };
    let mut axes: Vec<(&str, Vec<Term>)> = Vec::new();
    let mut count: u64 = 1;
    for (name, dimension) in dimensions {
        let values = dimension_values(dimension).map_err(|e| bad(format!("dimension {name}: {e}")))?;
        count = count.saturating_mul(values.len() as u64);
        if refs.len() as u64 + count > MAX_GENERATED {
            return Err(bad(format!("more than {MAX_GENERATED} references")));
        }
        axes.push((name, values));
    }
    let mut names: Vec<(&str, Term)> =
        templates.iter().filter_map(|(k, v)| Some((k.as_str(), Term::Text(v.as_str()?.to_string())))).collect();
    let first_axis = names.len();
    names.extend(axes.iter().map(|(name, values)| (*name, values.first().cloned().unwrap_or(Term::Int(0)))));
    let mut at = vec![0usize; axes.len()];
    for _ in 0..count {
        for (a, (_, values)) in axes.iter().enumerate() {
            names[first_axis + a].1 = values[at[a]].clone();
        }
        let reference = match (&offset, &length) {
            (Some(offset), Some(length)) => {
                let start = whole(&render(offset, &names)?)?;
                Reference::Range {
                    url: urls.get(&render(&url, &names)?),
                    start,
                    len: Some(whole(&render(length, &names)?)?),
                }
            }
            _ => Reference::Range { url: urls.get(&render(&url, &names)?), start: 0, len: None },
        };
        refs.push((render(&key, &names)?, reference));
        // The next combination: the last dimension fastest.
        for a in (0..axes.len()).rev() {
            at[a] += 1;
            if at[a] < axes[a].1.len() {
                break;
            }
            at[a] = 0;
        }
    }
    Ok(())
}

fn whole(text: &str) -> Result<u64> {
    text.trim().parse().map_err(|_| bad(format!("{text:?} is not a whole number of bytes")))
}

/// A dimension's values: a range's, or a list's.
fn dimension_values(dimension: &Value) -> Result<Vec<Term>> {
    match dimension {
        Value::Array(values) => values
            .iter()
            .map(|v| match v {
                Value::Number(n) => n.as_i64().map(Term::Int).ok_or_else(|| bad(format!("{n} is not a whole number"))),
                Value::String(text) => Ok(Term::Text(text.clone())),
                other => Err(bad(format!("{other} is neither a number nor a string"))),
            })
            .collect(),
        Value::Object(range) => {
            let field = |name: &str, default: Option<i64>| match range.get(name) {
                None => default.ok_or_else(|| bad(format!("no \"{name}\""))),
                Some(v) => v.as_i64().ok_or_else(|| bad(format!("\"{name}\" is not a whole number"))),
            };
            let (start, stop, step) = (field("start", Some(0))?, field("stop", None)?, field("step", Some(1))?);
            if step <= 0 {
                return Err(bad("a step that is not positive"));
            }
            let len = if stop > start { (stop - start - 1) / step + 1 } else { 0 };
            if len as u64 > MAX_GENERATED {
                return Err(bad(format!("more than {MAX_GENERATED} values")));
            }
            Ok((0..len).map(|i| Term::Int(start + i * step)).collect())
        }
        other => Err(bad(format!("{other} is neither a range nor a list"))),
    }
}

/// `template` with each `{{ expression }}` replaced by its value.
fn render(template: &str, names: &[(&str, Term)]) -> Result<String> {
    let mut out = String::with_capacity(template.len() + 8);
    let mut rest = template;
    while let Some(open) = rest.find("{{") {
        let close = rest[open..].find("}}").ok_or_else(|| bad(format!("{template:?}: a {{{{ with no }}}}")))? + open;
        out.push_str(&rest[..open]);
        let value = evaluate(&rest[open + 2..close], names).map_err(|e| bad(format!("{template:?}: {e}")))?;
        out.push_str(&value.to_string());
        rest = &rest[close + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The value of one expression.
fn evaluate(expression: &str, names: &[(&str, Term)]) -> Result<Term> {
    let tokens = tokens(expression)?;
    let mut parser = Parser { tokens: &tokens, at: 0, names };
    let value = parser.sum()?;
    match parser.tokens.get(parser.at) {
        None => Ok(value),
        Some(token) => Err(bad(format!("{expression:?}: {token:?} unexpected"))),
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Int(i64),
    Name(String),
    Op(&'static str),
}

fn tokens(expression: &str) -> Result<Vec<Token>> {
    let mut out = Vec::new();
    let chars: Vec<char> = expression.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c.is_ascii_digit() {
            let start = i;
            while i < chars.len() && chars[i].is_ascii_digit() {
                i += 1;
            }
            let digits: String = chars[start..i].iter().collect();
            out.push(Token::Int(digits.parse().map_err(|_| bad(format!("{digits} is too large")))?));
        } else if c.is_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push(Token::Name(chars[start..i].iter().collect()));
        } else {
            let op = match (c, chars.get(i + 1)) {
                ('/', Some('/')) => "//",
                ('+', _) => "+",
                ('-', _) => "-",
                ('*', _) => "*",
                ('%', _) => "%",
                ('(', _) => "(",
                (')', _) => ")",
                _ => return Err(bad(format!("{expression:?}: {c:?} is not in the expressions shardfs evaluates"))),
            };
            i += op.len();
            out.push(Token::Op(op));
        }
    }
    Ok(out)
}

/// Whole-number arithmetic, by precedence: `+ -` over `* // %` over unary minus and parentheses.
struct Parser<'a> {
    tokens: &'a [Token],
    at: usize,
    names: &'a [(&'a str, Term)],
}

impl Parser<'_> {
    fn next_op(&mut self, ops: &[&'static str]) -> Option<&'static str> {
        match self.tokens.get(self.at) {
            Some(Token::Op(op)) if ops.contains(op) => {
                self.at += 1;
                Some(op)
            }
            _ => None,
        }
    }

    fn sum(&mut self) -> Result<Term> {
        let mut value = self.product()?;
        while let Some(op) = self.next_op(&["+", "-"]) {
            let (a, b) = (int(&value)?, int(&self.product()?)?);
            let result = if op == "+" { a.checked_add(b) } else { a.checked_sub(b) };
            value = Term::Int(result.ok_or_else(overflow)?);
        }
        Ok(value)
    }

    fn product(&mut self) -> Result<Term> {
        let mut value = self.factor()?;
        while let Some(op) = self.next_op(&["*", "//", "%"]) {
            let (a, b) = (int(&value)?, int(&self.factor()?)?);
            let result = match op {
                "*" => a.checked_mul(b),
                _ if b == 0 => return Err(bad("division by zero")),
                // Python's // and % round toward negative infinity.
                "//" => Some(a.div_euclid(b) - i64::from(b < 0 && a.rem_euclid(b) != 0)),
                _ => Some(a.rem_euclid(b) + if b < 0 && a.rem_euclid(b) != 0 { b } else { 0 }),
            };
            value = Term::Int(result.ok_or_else(overflow)?);
        }
        Ok(value)
    }

    fn factor(&mut self) -> Result<Term> {
        if self.next_op(&["-"]).is_some() {
            return Ok(Term::Int(int(&self.factor()?)?.checked_neg().ok_or_else(overflow)?));
        }
        if self.next_op(&["("]).is_some() {
            let value = self.sum()?;
            return match self.next_op(&[")"]) {
                Some(_) => Ok(value),
                None => Err(bad("a ( with no )")),
            };
        }
        let token = self.tokens.get(self.at).cloned();
        self.at += 1;
        match token {
            Some(Token::Int(n)) => Ok(Term::Int(n)),
            Some(Token::Name(name)) => self
                .names
                .iter()
                .rev()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.clone())
                .ok_or_else(|| bad(format!("no dimension or template named {name:?}"))),
            Some(token) => Err(bad(format!("{token:?} unexpected"))),
            None => Err(bad("an expression that ends too soon")),
        }
    }
}

fn int(term: &Term) -> Result<i64> {
    match term {
        Term::Int(n) => Ok(*n),
        Term::Text(text) => Err(bad(format!("{text:?} is text, not a number"))),
    }
}

fn overflow() -> RefError {
    bad("a number too large")
}

#[cfg(test)]
mod tests {
    use super::super::parse_json;
    use super::*;

    #[test]
    fn the_specs_example_generates_its_keys() {
        let refs = parse_json(
            br#"{"version": 1, "templates": {"u": "server.domain/path"},
                 "gen": [{"key": "gen_key{{i}}", "url": "http://{{u}}_{{i}}", "offset": "{{(i + 1) * 1000}}",
                          "length": "1000", "dimensions": {"i": {"stop": 5}}}]}"#,
        )
        .unwrap();
        assert_eq!(refs.len(), 5);
        assert_eq!(refs[4].0, "gen_key4");
        assert_eq!(
            refs[4].1,
            Reference::Range { url: "http://server.domain/path_4".into(), start: 5000, len: Some(1000) }
        );
    }

    #[test]
    fn the_last_dimension_varies_fastest_and_lists_are_values() {
        let refs = parse_json(
            br#"{"version": 1, "gen": [{"key": "v/{{t}}.{{j}}", "url": "f_{{t}}.nc",
                 "dimensions": {"t": ["a", "b"], "j": {"start": 1, "stop": 7, "step": 3}}}]}"#,
        )
        .unwrap();
        let keys: Vec<&str> = refs.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["v/a.1", "v/a.4", "v/b.1", "v/b.4"]);
        assert_eq!(refs[2].1, Reference::Range { url: "f_b.nc".into(), start: 0, len: None });
    }

    #[test]
    fn arithmetic_is_pythons() {
        let names = [("i", Term::Int(-7))];
        for (expression, value) in [("i // 2", -4), ("i % 3", 2), ("-i * (2 + 1)", 21), ("7 // -2", -4), ("7 % -2", -1)]
        {
            assert_eq!(evaluate(expression, &names).unwrap(), Term::Int(value), "{expression}");
        }
        for expression in ["i / 2", "i +", "(i", "j", "i // 0", "9223372036854775807 + 1"] {
            assert!(evaluate(expression, &names).is_err(), "{expression}");
        }
    }

    #[test]
    fn hostile_entries_fail_with_their_number() {
        for entries in [
            r#"[{"key": "k{{i}}", "url": "u", "dimensions": {"i": {"stop": 100000}, "j": {"stop": 100000}}}]"#,
            r#"[{"key": "k", "url": "u", "offset": "1", "dimensions": {}}]"#,
            r#"[{"key": "k", "url": "u", "dimensions": {"i": {"stop": 2, "step": 0}}}]"#,
            r#"[{"url": "u", "dimensions": {}}]"#,
        ] {
            let doc = format!(r#"{{"version": 1, "gen": {entries}}}"#);
            assert!(parse_json(doc.as_bytes()).unwrap_err().0.starts_with("gen entry 0: "), "{entries}");
        }
    }
}
