//! The attribute's keys, and their parsing and validation.

use proc_macro2::Span;
use syn::spanned::Spanned;
use syn::{Expr, ExprArray, ExprLit, Lit, LitStr, Path};

/// A value with the span of the token it came from.
pub(crate) struct At<T> {
    pub(crate) value: T,
    pub(crate) span: Span,
}

impl<T> At<T> {
    pub(crate) fn new(value: T, span: Span) -> Self {
        Self { value, span }
    }
}

#[derive(Default)]
pub(crate) struct Args {
    pub(crate) queue: Option<At<String>>,
    pub(crate) name: Option<At<String>>,
    pub(crate) exchange: Option<At<String>>,
    pub(crate) routing_keys: Vec<At<String>>,
    pub(crate) routing_key_span: Option<Span>,
    pub(crate) exchange_kind: Option<At<String>>,
    pub(crate) queue_type: Option<At<String>>,
    pub(crate) delivery_limit: Option<At<u32>>,
    pub(crate) tier_queue_type: Option<At<String>>,
    pub(crate) ack: Option<At<String>>,
    pub(crate) manual_fallback: Option<At<String>>,
    pub(crate) requeue_limit: Option<At<u32>>,
    pub(crate) retry: Option<At<Vec<u64>>>,
    pub(crate) max_attempts: Option<At<u32>>,
    pub(crate) immediate_retries: Option<At<u32>>,
    pub(crate) jitter: Option<At<bool>>,
    pub(crate) prefetch: Option<At<u16>>,
    pub(crate) concurrency: Option<At<usize>>,
    pub(crate) deadline: Option<At<u64>>,
    pub(crate) kinds: Vec<KindArg>,
    /// `error_kind = T` or `[T, U]`: the types, and the key's span.
    pub(crate) error_kinds: Option<At<Vec<Path>>>,
    /// `kinds = ["..."]`: kinds given ad hoc.
    pub(crate) adhoc_kinds: Option<At<Vec<String>>>,
    /// Max acks and max delay (nanoseconds).
    pub(crate) ack_coalescing: Option<At<(u16, u64)>>,
    pub(crate) krate: Option<Path>,
}

/// One `on_kind("KIND", ...)`.
pub(crate) struct KindArg {
    pub(crate) kind: At<String>,
    pub(crate) park: bool,
    pub(crate) retry: Option<Vec<u64>>,
    pub(crate) max_attempts: Option<u32>,
}

const KIND_KEYS: &str = "park, retry, max_attempts";

const KEYS: &str = "queue, name, exchange, routing_key, routing_keys, exchange_kind, queue_type, \
                    delivery_limit, tier_queue_type, ack, manual_fallback, requeue_limit, retry, max_attempts, \
                    immediate_retries, jitter, on_kind, error_kind, kinds, prefetch, concurrency, deadline, \
                    ack_coalescing, crate";

/// The known key nearest to a misspelt one, if it is near (edit distance at most 2).
fn closest(key: &str) -> Option<&'static str> {
    KEYS.split(", ")
        .map(str::trim)
        .map(|k| (edit_distance(key, k), k))
        .filter(|(d, _)| *d <= 2)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != *cb);
            cur[j + 1] = (prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

fn set<T>(slot: &mut Option<T>, value: T, span: Span, key: &str) -> syn::Result<()> {
    if slot.is_some() {
        return Err(syn::Error::new(span, format!("`{key}` is given twice")));
    }
    *slot = Some(value);
    Ok(())
}

fn one_of(s: &LitStr, allowed: &[&str], key: &str) -> syn::Result<At<String>> {
    let v = s.value();
    if allowed.contains(&v.as_str()) {
        Ok(At {
            value: v,
            span: s.span(),
        })
    } else {
        let list = allowed
            .iter()
            .map(|a| format!("\"{a}\""))
            .collect::<Vec<_>>()
            .join(", ");
        Err(syn::Error::new(
            s.span(),
            format!("unknown `{key}` value \"{v}\": expected one of {list}"),
        ))
    }
}

fn name_str(s: &LitStr, key: &str) -> syn::Result<At<String>> {
    let v = s.value();
    if v.is_empty() {
        return Err(syn::Error::new(
            s.span(),
            format!("`{key}` must not be empty"),
        ));
    }
    if v.len() > 255 {
        return Err(syn::Error::new(
            s.span(),
            format!("`{key}` is {} bytes; AMQP names are at most 255", v.len()),
        ));
    }
    Ok(At {
        value: v,
        span: s.span(),
    })
}

fn duration(s: &LitStr, key: &str) -> syn::Result<u64> {
    let d = humantime::parse_duration(&s.value()).map_err(|e| {
        syn::Error::new(
            s.span(),
            format!(
                "`{key}`: \"{}\" is not a duration ({e}); write e.g. \"500ms\", \"30s\", \"5m\"",
                s.value()
            ),
        )
    })?;
    u64::try_from(d.as_nanos())
        .map_err(|_| syn::Error::new(s.span(), format!("`{key}`: duration too long")))
}

fn int<T: std::str::FromStr>(e: &Expr, key: &str, what: &str) -> syn::Result<T>
where
    T::Err: std::fmt::Display,
{
    match e {
        Expr::Lit(ExprLit {
            lit: Lit::Int(i), ..
        }) => i
            .base10_parse::<T>()
            .map_err(|err| syn::Error::new(i.span(), format!("`{key}` must be {what}: {err}"))),
        other => Err(syn::Error::new(
            other.span(),
            format!("`{key}` must be an integer literal ({what})"),
        )),
    }
}

/// An integer literal that must not be zero.
fn positive<T>(e: &Expr, key: &str, what: &str, zero: &str) -> syn::Result<At<T>>
where
    T: std::str::FromStr + Default + PartialEq,
    T::Err: std::fmt::Display,
{
    let v = int::<T>(e, key, what)?;
    if v == T::default() {
        return Err(syn::Error::new(e.span(), format!("`{key}` must be {zero}")));
    }
    Ok(At::new(v, e.span()))
}

fn string(e: &Expr, key: &str) -> syn::Result<LitStr> {
    match e {
        Expr::Lit(ExprLit {
            lit: Lit::Str(s), ..
        }) => Ok(s.clone()),
        other => Err(syn::Error::new(
            other.span(),
            format!("`{key}` must be a string literal"),
        )),
    }
}

fn strings(e: &Expr, key: &str) -> syn::Result<(Vec<LitStr>, Span)> {
    match e {
        Expr::Array(ExprArray { elems, .. }) => {
            let v = elems
                .iter()
                .map(|el| string(el, key))
                .collect::<syn::Result<Vec<_>>>()?;
            Ok((v, e.span()))
        }
        other => Err(syn::Error::new(
            other.span(),
            format!("`{key}` must be an array of string literals, e.g. [\"a\", \"b\"]"),
        )),
    }
}

/// Retry tiers: an array of durations, each between 1 ms and a 32-bit TTL, in nanoseconds.
fn tiers(e: &Expr, key: &str) -> syn::Result<(Vec<u64>, Span)> {
    let (lits, arr) = strings(e, key)?;
    let mut tiers = Vec::with_capacity(lits.len());
    for l in &lits {
        let ns = duration(l, key)?;
        let ms = ns / 1_000_000;
        if ms == 0 || ms > i32::MAX as u64 {
            return Err(syn::Error::new(
                l.span(),
                format!(
                    "retry tiers must be between 1ms and {}ms (a 32-bit TTL)",
                    i32::MAX
                ),
            ));
        }
        tiers.push(ns);
    }
    Ok((tiers, arr))
}

/// A kind's name: 1-64 letters, digits, `-`, `_` or `.`, as `RetryPolicy::validate` wants.
fn kind_name(lit: &LitStr) -> syn::Result<String> {
    let name = lit.value();
    if name.is_empty()
        || name.len() > 64
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
    {
        return Err(syn::Error::new(
            lit.span(),
            "a kind is 1-64 characters of letters, digits, '-', '_' or '.'",
        ));
    }
    Ok(name)
}

/// `error_kind = T` or `error_kind = [T, U]`: paths of types implementing `ErrorKind`.
fn type_paths(e: &Expr, key: &str) -> syn::Result<Vec<Path>> {
    let one = |e: &Expr| match e {
        Expr::Path(p) if p.qself.is_none() => Ok(p.path.clone()),
        other => Err(syn::Error::new(
            other.span(),
            format!(
                "`{key}` must be a type implementing `ErrorKind`, e.g. `{key} = ChargeError`, or a list `[ChargeError, StockError]`"
            ),
        )),
    };
    match e {
        Expr::Array(a) if a.elems.is_empty() => Err(syn::Error::new(
            a.span(),
            format!("`{key} = []` registers nothing: leave it out"),
        )),
        Expr::Array(a) => a.elems.iter().map(one).collect(),
        other => Ok(vec![one(other)?]),
    }
}

/// The inside of `on_kind(...)`: the kind, then `park`, `retry` and `max_attempts`, checked
/// as `RetryPolicy::validate` checks a kind's policy.
fn parse_kind(content: syn::parse::ParseStream<'_>, span: Span) -> syn::Result<KindArg> {
    let lit: LitStr = content.parse().map_err(|e| {
        syn::Error::new(
            e.span(),
            "`on_kind` starts with the kind as a string literal: `on_kind(\"inventory\", ...)`",
        )
    })?;
    let name = kind_name(&lit)?;
    let mut park: Option<At<bool>> = None;
    let mut retry: Option<At<Vec<u64>>> = None;
    let mut max_attempts: Option<At<u32>> = None;
    while !content.is_empty() {
        content.parse::<syn::Token![,]>()?;
        if content.is_empty() {
            break;
        }
        let ident: syn::Ident = syn::ext::IdentExt::parse_any(content)?;
        let key = ident.to_string();
        let key_span = ident.span();
        content.parse::<syn::Token![=]>().map_err(|_| {
            syn::Error::new(key_span, format!("`{key}` needs a value: `{key} = ...`"))
        })?;
        let value: Expr = content.parse()?;
        match key.as_str() {
            "park" => match &value {
                Expr::Lit(ExprLit {
                    lit: Lit::Bool(b), ..
                }) if b.value => set(&mut park, At::new(true, b.span()), key_span, &key)?,
                Expr::Lit(ExprLit {
                    lit: Lit::Bool(b), ..
                }) => {
                    return Err(syn::Error::new(
                        b.span(),
                        "`park = false` says nothing: leave it out",
                    ));
                }
                other => {
                    return Err(syn::Error::new(other.span(), "`park` must be `true`"));
                }
            },
            "retry" => {
                let (t, arr) = tiers(&value, "retry")?;
                set(&mut retry, At::new(t, arr), key_span, &key)?;
            }
            "max_attempts" => {
                let v = positive::<u32>(&value, "max_attempts", "a u32", "at least 1")?;
                set(&mut max_attempts, v, key_span, &key)?;
            }
            other => {
                // A worker config file names a kind's tiers `tiers`; the attribute, like its
                // own `retry` key, names them `retry`.
                let hint = if other == "tiers" {
                    " (a kind's tiers are `retry = [...]` here)"
                } else {
                    ""
                };
                return Err(syn::Error::new(
                    key_span,
                    format!("unknown `on_kind` key `{other}`{hint}: expected one of {KIND_KEYS}"),
                ));
            }
        }
    }
    if let Some(p) = &park
        && (retry.is_some() || max_attempts.is_some())
    {
        return Err(syn::Error::new(
            p.span,
            "`park = true` parks at once: it takes no `retry` or `max_attempts`",
        ));
    }
    if park.is_none() && retry.is_none() && max_attempts.is_none() {
        return Err(syn::Error::new(
            span,
            format!(
                "`on_kind(\"{name}\")` says nothing: give `park = true`, `retry = [...]` or `max_attempts = N`"
            ),
        ));
    }
    Ok(KindArg {
        kind: At::new(name, lit.span()),
        park: park.is_some(),
        retry: retry.map(|r| r.value),
        max_attempts: max_attempts.map(|m| m.value),
    })
}

/// `(max_acks, "max_delay")`: at least 1 ack, at most 1 s (the bound against the prefetch
/// is checked when the worker starts, or here when `prefetch` is given).
fn coalescing(e: &Expr, key: &str) -> syn::Result<At<(u16, u64)>> {
    let pair = match e {
        Expr::Tuple(t) if t.elems.len() == 2 => Some((&t.elems[0], &t.elems[1])),
        _ => None,
    };
    let Some((acks, delay)) = pair else {
        return Err(syn::Error::new(
            e.span(),
            format!("`{key}` must be `(max_acks, \"max_delay\")`, e.g. `(32, \"5ms\")`"),
        ));
    };
    let n = positive::<u16>(acks, key, "between 1 and 65535", "at least 1 ack")?;
    let s = string(delay, key)?;
    let ns = duration(&s, key)?;
    if ns > 1_000_000_000 {
        return Err(syn::Error::new(
            s.span(),
            format!("`{key}`: the delay must be at most 1s"),
        ));
    }
    Ok(At::new((n.value, ns), e.span()))
}

impl Args {
    pub(crate) fn parse(&mut self, meta: syn::meta::ParseNestedMeta<'_>) -> syn::Result<()> {
        let span = meta.path.span();
        let Some(ident) = meta.path.get_ident().map(ToString::to_string) else {
            return Err(meta.error(format!("unknown key: expected one of {KEYS}")));
        };
        // `crate` is a keyword; `get_ident` still yields it.
        let key = ident.as_str();
        if key == "on_kind" {
            if !meta.input.peek(syn::token::Paren) {
                return Err(syn::Error::new(
                    span,
                    "`on_kind` takes parentheses: `on_kind(\"inventory\", retry = [\"30s\"])`",
                ));
            }
            let content;
            syn::parenthesized!(content in meta.input);
            let kind = parse_kind(&content, span)?;
            if self.kinds.iter().any(|k| k.kind.value == kind.kind.value) {
                return Err(syn::Error::new(
                    kind.kind.span,
                    format!("`on_kind(\"{}\")` is given twice", kind.kind.value),
                ));
            }
            self.kinds.push(kind);
            return Ok(());
        }
        let value: Expr = meta
            .value()
            .map_err(|_| syn::Error::new(span, format!("`{key}` needs a value: `{key} = ...`")))?
            .parse()?;
        match key {
            "queue" => set(
                &mut self.queue,
                name_str(&string(&value, key)?, key)?,
                span,
                key,
            ),
            "name" => set(
                &mut self.name,
                name_str(&string(&value, key)?, key)?,
                span,
                key,
            ),
            "exchange" => {
                let s = string(&value, key)?;
                // The default exchange ("") cannot be bound; a long name is refused.
                set(&mut self.exchange, name_str(&s, key)?, span, key)
            }
            "routing_key" | "routing_keys" => {
                if self.routing_key_span.is_some() {
                    return Err(syn::Error::new(
                        span,
                        "give either `routing_key` or `routing_keys`, once",
                    ));
                }
                self.routing_key_span = Some(span);
                let lits = if key == "routing_key" {
                    vec![string(&value, key)?]
                } else {
                    let (v, arr) = strings(&value, key)?;
                    if v.is_empty() {
                        return Err(syn::Error::new(arr, "`routing_keys` must not be empty"));
                    }
                    v
                };
                for l in lits {
                    if l.value().len() > 255 {
                        return Err(syn::Error::new(
                            l.span(),
                            "routing keys are at most 255 bytes",
                        ));
                    }
                    self.routing_keys.push(At {
                        value: l.value(),
                        span: l.span(),
                    });
                }
                Ok(())
            }
            "exchange_kind" => {
                let v = one_of(
                    &string(&value, key)?,
                    &["topic", "direct", "fanout", "headers"],
                    key,
                )?;
                set(&mut self.exchange_kind, v, span, key)
            }
            "queue_type" => {
                let v = one_of(&string(&value, key)?, &["classic", "quorum"], key)?;
                set(&mut self.queue_type, v, span, key)
            }
            "delivery_limit" => {
                let v = positive::<u32>(&value, key, "a u32", "at least 1")?;
                set(&mut self.delivery_limit, v, span, key)
            }
            "tier_queue_type" => {
                let v = one_of(&string(&value, key)?, &["classic", "quorum"], key)?;
                set(&mut self.tier_queue_type, v, span, key)
            }
            "ack" => {
                let v = one_of(
                    &string(&value, key)?,
                    &["auto", "manual", "nack-on-error", "ack-first"],
                    key,
                )?;
                set(&mut self.ack, v, span, key)
            }
            "manual_fallback" => {
                let v = one_of(
                    &string(&value, key)?,
                    &["nack-requeue", "auto", "ack", "reject"],
                    key,
                )?;
                set(&mut self.manual_fallback, v, span, key)
            }
            "retry" => {
                let (tiers, arr) = tiers(&value, key)?;
                set(&mut self.retry, At::new(tiers, arr), span, key)
            }
            "requeue_limit" => {
                let v = positive::<u32>(&value, key, "a u32", "at least 1")?;
                set(&mut self.requeue_limit, v, span, key)
            }
            "max_attempts" => {
                let v = positive::<u32>(&value, key, "a u32", "at least 1")?;
                set(&mut self.max_attempts, v, span, key)
            }
            "immediate_retries" => {
                let v = int::<u32>(&value, key, "a u32")?;
                set(
                    &mut self.immediate_retries,
                    At::new(v, value.span()),
                    span,
                    key,
                )
            }
            "jitter" => match &value {
                Expr::Lit(ExprLit {
                    lit: Lit::Bool(b), ..
                }) => set(&mut self.jitter, At::new(b.value, b.span()), span, key),
                other => Err(syn::Error::new(
                    other.span(),
                    "`jitter` must be `true` or `false`",
                )),
            },
            "prefetch" => {
                let v = positive::<u16>(
                    &value,
                    key,
                    "between 1 and 65535",
                    "at least 1 (0 would mean unlimited in-flight deliveries)",
                )?;
                set(&mut self.prefetch, v, span, key)
            }
            "concurrency" => {
                let v = positive::<usize>(&value, key, "a positive integer", "at least 1")?;
                set(&mut self.concurrency, v, span, key)
            }
            "deadline" => {
                let s = string(&value, key)?;
                let ns = duration(&s, key)?;
                if ns == 0 {
                    return Err(syn::Error::new(
                        s.span(),
                        "`deadline` must be longer than zero",
                    ));
                }
                set(&mut self.deadline, At::new(ns, s.span()), span, key)
            }
            "error_kind" => {
                let v = type_paths(&value, key)?;
                set(&mut self.error_kinds, At::new(v, value.span()), span, key)
            }
            "kinds" => {
                let (lits, arr) = strings(&value, key)?;
                if lits.is_empty() {
                    return Err(syn::Error::new(
                        arr,
                        "`kinds = []` declares nothing: leave it out",
                    ));
                }
                let names = lits.iter().map(kind_name).collect::<syn::Result<_>>()?;
                set(&mut self.adhoc_kinds, At::new(names, arr), span, key)
            }
            "ack_coalescing" => {
                let v = coalescing(&value, key)?;
                set(&mut self.ack_coalescing, v, span, key)
            }
            "crate" => {
                let s = string(&value, key)?;
                let p: Path = s.parse().map_err(|_| {
                    syn::Error::new(s.span(), "`crate` must be a path, e.g. \"::rabbitkit\"")
                })?;
                if self.krate.is_some() {
                    return Err(syn::Error::new(span, "`crate` is given twice"));
                }
                self.krate = Some(p);
                Ok(())
            }
            other => {
                let hint = closest(other)
                    .map(|k| format!(" (did you mean `{k}`?)"))
                    .unwrap_or_default();
                Err(syn::Error::new(
                    span,
                    format!("unknown key `{other}`{hint}: expected one of {KEYS}"),
                ))
            }
        }
    }
}
