//! Key paths and positions in a config document, for error messages: which key
//! (`subscribers[1].retry.max-attempts`), on which line and column.
//!
//! A line scanner, not a second TOML parser: it only runs on a document `toml` has already
//! read (or refused), and only to name a place. It knows table headers, arrays of tables
//! and `key = value` lines; a key inside an inline table is named after the line's key.

/// A key (or a table header) and where it starts.
#[derive(Debug)]
struct Entry {
    path: String,
    offset: usize,
}

fn entries(src: &str) -> Vec<Entry> {
    let mut out = Vec::new();
    let mut header = String::new();
    // Arrays of tables seen so far, with the index of their last element.
    let mut arrays: Vec<(String, usize)> = Vec::new();
    let mut offset = 0;
    for line in src.split_inclusive('\n') {
        let indent = line.len() - line.trim_start().len();
        let t = line.trim();
        if let Some(rest) = t.strip_prefix("[[") {
            let name = rest
                .split("]]")
                .next()
                .unwrap_or_default()
                .trim()
                .to_owned();
            let index = match arrays.iter_mut().find(|(n, _)| *n == name) {
                Some((_, i)) => {
                    *i += 1;
                    *i
                }
                None => {
                    arrays.push((name.clone(), 0));
                    0
                }
            };
            header = format!("{}[{index}]", resolve(&name, &arrays));
            out.push(Entry {
                path: header.clone(),
                offset: offset + indent,
            });
        } else if let Some(rest) = t.strip_prefix('[') {
            let name = rest.split(']').next().unwrap_or_default().trim();
            header = resolve(name, &arrays);
            out.push(Entry {
                path: header.clone(),
                offset: offset + indent,
            });
        } else if !t.starts_with('#')
            && let Some((key, _)) = t.split_once('=')
        {
            let key = key.trim().trim_matches('"');
            if !key.is_empty() && !key.contains(['{', '[', '"', ',']) {
                out.push(Entry {
                    path: join(&header, key),
                    offset: offset + indent,
                });
            }
        }
        offset += line.len();
    }
    out
}

/// `subscribers.retry` inside the second `[[subscribers]]` is `subscribers[1].retry`.
fn resolve(name: &str, arrays: &[(String, usize)]) -> String {
    let best = arrays
        .iter()
        .filter(|(n, _)| name.starts_with(n.as_str()) && name[n.len()..].starts_with('.'))
        .max_by_key(|(n, _)| n.len());
    match best {
        Some((n, i)) => format!("{n}[{i}]{}", &name[n.len()..]),
        None => name.to_owned(),
    }
}

fn join(a: &str, b: &str) -> String {
    if a.is_empty() {
        b.to_owned()
    } else {
        format!("{a}.{b}")
    }
}

/// The path of the key at byte `offset` (an error's span). When the span is itself a key
/// inside an inline table (an unknown field there), it is appended.
pub(crate) fn path_at(src: &str, offset: usize) -> String {
    let all = entries(src);
    let Some(e) = all.iter().rev().find(|e| e.offset <= offset) else {
        return String::new();
    };
    let word: String = src
        .get(offset..)
        .unwrap_or_default()
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .collect();
    let after = src.get(offset + word.len()..).unwrap_or_default();
    let is_key = after.trim_start().starts_with('=') && !after.trim_start().starts_with("==");
    if is_key && offset > e.offset && !word.is_empty() && !e.path.ends_with(&word) {
        join(&e.path, &word)
    } else {
        e.path.clone()
    }
}

/// 1-based line and column of byte `offset`.
pub(crate) fn line_col(src: &str, offset: usize) -> (usize, usize) {
    let before = src.get(..offset.min(src.len())).unwrap_or_default();
    let line = before.matches('\n').count() + 1;
    let column = before
        .rsplit('\n')
        .next()
        .unwrap_or_default()
        .chars()
        .count()
        + 1;
    (line, column)
}

/// Where `path` is written: the key itself, or the closest enclosing table that is.
pub(crate) fn locate(src: &str, path: &str) -> (usize, usize) {
    let all = entries(src);
    let mut p = path;
    loop {
        if let Some(e) = all.iter().find(|e| e.path == p) {
            return line_col(src, e.offset);
        }
        match p.rfind(['.', '[']) {
            Some(i) => p = &p[..i],
            None => return (1, 1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = "top = 1\n[connection]\nurl = \"x\"\n\n[[subs]]\nq = 1\n[subs.retry]\n  tiers = [\n \"1s\",\n]\n[[subs]]\nq = 3\nb = [{ exchange = \"e\", oops = 1 }]\n";

    #[test]
    fn paths_name_array_elements_and_nested_tables() {
        let at = |needle: &str| path_at(DOC, DOC.find(needle).unwrap_or(0));
        assert_eq!(at("top"), "top");
        assert_eq!(at("\"x\""), "connection.url");
        assert_eq!(at("q = 1"), "subs[0].q");
        assert_eq!(at("\"1s\""), "subs[0].retry.tiers");
        assert_eq!(at("q = 3"), "subs[1].q");
        assert_eq!(at("oops"), "subs[1].b.oops");
    }

    #[test]
    fn locate_finds_the_key_or_its_table() {
        assert_eq!(locate(DOC, "subs[1].q"), (12, 1));
        assert_eq!(locate(DOC, "subs[0].retry.tiers"), (8, 3));
        assert_eq!(locate(DOC, "subs[0].retry.max-attempts"), (7, 1));
        assert_eq!(locate(DOC, "connection.tls"), (2, 1));
        assert_eq!(line_col(DOC, 0), (1, 1));
    }
}
