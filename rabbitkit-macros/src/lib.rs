//! The `#[subscriber]` attribute of [rabbitkit](https://docs.rs/rabbitkit).
//!
//! Use it through the facade: `use rabbitkit::subscriber;`. Everything it generates is
//! plain builder code (`Subscriber::new(..).bind(..).retry(..)`) reached through the
//! facade's hidden `__private` path; see the facade's documentation for the keys.

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as TokenStream2};
use quote::{format_ident, quote, quote_spanned};
use syn::parse::Parser;
use syn::spanned::Spanned;
use syn::{Expr, ExprArray, ExprLit, FnArg, ItemFn, Lit, LitStr, Path, Type};

/// Turns an `async fn` handler into a subscriber a worker can register.
///
/// ```text
/// #[subscriber(queue = "orders", exchange = "shop", routing_key = "order.*",
///              retry = ["1s", "30s"], max_attempts = 4, prefetch = 50)]
/// async fn handle_order(Json(order): Json<Order>) -> Result<(), BoxError> { Ok(()) }
///
/// Worker::new(config).subscribe(handle_order)
/// ```
///
/// The function becomes a unit struct of the same name that implements `IntoSubscriber`;
/// the function itself stays callable as `handle_order::handler(..)`, and
/// `handle_order::subscriber()` returns the configured `Subscriber`.
///
/// Keys (all but `queue` optional):
///
/// | key | value | builder call |
/// |---|---|---|
/// | `queue` | `"orders"` | `Subscriber::new` |
/// | `name` | `"orders-v2"` (default: the function name) | `.name` |
/// | `exchange` | `"shop"` (needs a routing key) | `.bind` |
/// | `routing_key` | `"order.*"` | `.bind` |
/// | `routing_keys` | `["order.created", "order.paid"]` | `.bind` per key |
/// | `exchange_kind` | `"topic"`, `"direct"`, `"fanout"`, `"headers"` | `.exchange_kind` |
/// | `queue_type` | `"classic"`, `"quorum"` | `.queue_type` |
/// | `delivery_limit` | `10` (quorum only) | `.delivery_limit` |
/// | `tier_queue_type` | `"quorum"` (default), `"classic"` (opt-in: at-most-once dead-lettering out of the tiers) | `.tier_queue_type` |
/// | `ack` | `"auto"`, `"manual"`, `"nack-on-error"`, `"ack-first"` | `.ack_policy` |
/// | `manual_fallback` | `"nack-requeue"`, `"auto"`, `"ack"`, `"reject"` | `.manual_fallback` |
/// | `requeue_limit` | `20` (at least 1) | `.requeue_limit` |
/// | `retry` | `["1s", "30s", "5m"]`; `[]` for no retries | `.retry(RetryPolicy::new(..))` |
/// | `max_attempts` | `5` | `RetryPolicy::max_attempts` |
/// | `immediate_retries` | `2` | `RetryPolicy::immediate_retries` |
/// | `jitter` | `true` | `RetryPolicy::jitter` |
/// | `on_kind` | `("inventory", retry = ["30s", "5m"], max_attempts = 10)`, `("validation", park = true)`; once per kind | `RetryPolicy::on_kind(kind, KindPolicy)` |
/// | `error_kind` | `ChargeError` or `[ChargeError, StockError]`: types implementing `ErrorKind` | `.error_kind::<ChargeError>()` per type |
/// | `kinds` | `["validation"]`: kinds the handler gives ad hoc (`.kind("validation")?`) | `.kinds([..])` |
/// | `prefetch` | `50` (1..=65535) | `.prefetch` |
/// | `concurrency` | `8` (at least 1) | `.concurrency` |
/// | `deadline` | `"30s"` | `.deadline` |
/// | `ack_coalescing` | `(32, "5ms")`: max acks (1..=prefetch), max delay (at most 1 s) | `.ack_coalescing` |
/// | `crate` | `"my_alias::rabbitkit"` (default `::rabbitkit`) | path of the facade |
///
/// `on_kind("KIND", ...)` gives failures of one error kind a policy of their own, like
/// `[subscribers.retry.kinds.KIND]` in a worker config file: `park = true` (parked at once),
/// or its own `retry = [...]` tiers and/or `max_attempts = N` (the others follow the
/// subscriber's policy). A kind is 1-64 letters, digits, `-`, `_` or `.`. The kinds an
/// `on_kind` names must be ones the handler's failures can carry: listed by an `error_kind`
/// type's `KINDS`, declared in `kinds`, or rabbitkit's own (`timeout`, `panic`, `decode`,
/// `error`, ...); the worker refuses to start otherwise.
#[proc_macro_attribute]
pub fn subscriber(attr: TokenStream, item: TokenStream) -> TokenStream {
    let item2 = TokenStream2::from(item.clone());
    let func = match syn::parse::<ItemFn>(item) {
        Ok(f) => f,
        Err(_) => {
            let e = syn::Error::new_spanned(&item2, "#[subscriber] goes on an `async fn` handler");
            return with_original(e, item2);
        }
    };
    let mut args = Args::default();
    let parser = syn::meta::parser(|meta| args.parse(meta));
    if let Err(e) = parser.parse(attr) {
        return with_stand_in(e, &args, &func);
    }
    let krate = args.krate.clone();
    let queue = args.queue.as_ref().map(|q| q.value.clone());
    match expand(args, func.clone()) {
        Ok(ts) => ts.into(),
        Err(e) => {
            let known = Args {
                krate,
                queue: queue.map(|q| At::new(q, Span::call_site())),
                ..Args::default()
            };
            with_stand_in(e, &known, &func)
        }
    }
}

/// A compile error plus the function as written, so that one mistake in the attribute
/// does not turn every use of the function into a second error.
fn with_original(e: syn::Error, item: TokenStream2) -> TokenStream {
    let err = e.to_compile_error();
    quote!(#err #item).into()
}

/// A compile error, and what the expansion would have defined, with a subscriber that
/// never runs (the crate does not compile): the unit struct, `NAME`, `QUEUE`, the function
/// as written under `handler` and an `IntoSubscriber` impl. Uses of the function
/// (`Worker::subscribe(orders)`, `orders::handler`) type-check, so the mistake in the
/// attribute is the only error reported, and the IDE still sees the handler's body. The
/// stand-in never checks the handler's arguments: a mistake there is reported by the
/// expansion itself once the attribute is right. A method (an `impl` cannot hold a struct)
/// keeps the function as written.
fn with_stand_in(e: syn::Error, args: &Args, func: &ItemFn) -> TokenStream {
    if func.sig.receiver().is_some() {
        return with_original(e, quote!(#func));
    }
    let err = e.to_compile_error();
    let krate = args
        .krate
        .clone()
        .unwrap_or_else(|| syn::parse_quote!(::rabbitkit));
    let p = quote!(#krate::__private);
    let vis = &func.vis;
    let ident = &func.sig.ident;
    let name_s = ident.to_string();
    let queue_s = args
        .queue
        .as_ref()
        .map_or(String::new(), |q| q.value.clone());
    let docs: Vec<_> = func
        .attrs
        .iter()
        .filter(|a| a.path().is_ident("doc"))
        .collect();
    let mut handler = func.clone();
    handler.sig.ident = format_ident!("handler", span = ident.span());
    quote! {
        #err
        #(#docs)*
        #[allow(non_camel_case_types)]
        #[derive(Debug, Clone, Copy, Default)]
        #vis struct #ident;

        #[allow(dead_code)]
        impl #ident {
            /// The subscriber's name.
            #vis const NAME: &'static str = #name_s;
            /// The work queue.
            #vis const QUEUE: &'static str = #queue_s;

            #handler

            /// Stands in for the configured subscriber while the attribute has an error.
            #vis fn subscriber() -> #p::Subscriber {
                #p::Subscriber::new(#queue_s, || async {})
            }
        }

        impl #p::IntoSubscriber for #ident {
            fn into_subscriber(self) -> #p::Subscriber {
                Self::subscriber()
            }
        }
    }
    .into()
}

/// A value with the span of the token it came from.
struct At<T> {
    value: T,
    span: Span,
}

impl<T> At<T> {
    fn new(value: T, span: Span) -> Self {
        Self { value, span }
    }
}

#[derive(Default)]
struct Args {
    queue: Option<At<String>>,
    name: Option<At<String>>,
    exchange: Option<At<String>>,
    routing_keys: Vec<At<String>>,
    routing_key_span: Option<Span>,
    exchange_kind: Option<At<String>>,
    queue_type: Option<At<String>>,
    delivery_limit: Option<At<u32>>,
    tier_queue_type: Option<At<String>>,
    ack: Option<At<String>>,
    manual_fallback: Option<At<String>>,
    requeue_limit: Option<At<u32>>,
    retry: Option<At<Vec<u64>>>,
    max_attempts: Option<At<u32>>,
    immediate_retries: Option<At<u32>>,
    jitter: Option<At<bool>>,
    prefetch: Option<At<u16>>,
    concurrency: Option<At<usize>>,
    deadline: Option<At<u64>>,
    kinds: Vec<KindArg>,
    /// `error_kind = T` or `[T, U]`: the types, and the key's span.
    error_kinds: Option<At<Vec<Path>>>,
    /// `kinds = ["..."]`: kinds given ad hoc.
    adhoc_kinds: Option<At<Vec<String>>>,
    /// Max acks and max delay (nanoseconds).
    ack_coalescing: Option<At<(u16, u64)>>,
    krate: Option<Path>,
}

/// One `on_kind("KIND", ...)`.
struct KindArg {
    kind: At<String>,
    park: bool,
    retry: Option<Vec<u64>>,
    max_attempts: Option<u32>,
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
    fn parse(&mut self, meta: syn::meta::ParseNestedMeta<'_>) -> syn::Result<()> {
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

/// Whether an argument's type is the manual-settlement handle (`Settle`, by any path).
fn is_settle(ty: &Type) -> bool {
    match ty {
        Type::Path(p) => p.path.segments.last().is_some_and(|s| s.ident == "Settle"),
        Type::Paren(p) => is_settle(&p.elem),
        Type::Group(g) => is_settle(&g.elem),
        _ => false,
    }
}

fn expand(args: Args, func: ItemFn) -> syn::Result<TokenStream2> {
    let sig = &func.sig;
    if sig.asyncness.is_none() {
        return Err(syn::Error::new(
            sig.fn_token.span(),
            "#[subscriber] handlers must be `async fn`",
        ));
    }
    if !sig.generics.params.is_empty() {
        return Err(syn::Error::new_spanned(
            &sig.generics,
            "#[subscriber] handlers cannot be generic: a worker needs one concrete handler",
        ));
    }
    if let Some(r) = sig.receiver() {
        return Err(syn::Error::new_spanned(
            r,
            "#[subscriber] goes on a free `async fn`, not a method",
        ));
    }
    let Some(queue) = args.queue else {
        return Err(syn::Error::new(
            Span::call_site(),
            "#[subscriber] needs `queue = \"...\"`",
        ));
    };
    match (&args.exchange, args.routing_key_span) {
        (Some(ex), None) => {
            return Err(syn::Error::new(
                ex.span,
                "`exchange` needs `routing_key = \"...\"` or `routing_keys = [...]` to bind with",
            ));
        }
        (None, Some(rk)) => {
            return Err(syn::Error::new(
                rk,
                "a routing key needs `exchange = \"...\"` to bind to",
            ));
        }
        _ => {}
    }
    let settle_arg = sig.inputs.iter().find_map(|a| match a {
        FnArg::Typed(t) if is_settle(&t.ty) => Some(t.ty.span()),
        _ => None,
    });
    let manual = args.ack.as_ref().is_some_and(|a| a.value == "manual");
    if manual && settle_arg.is_none() {
        let span = args.ack.as_ref().map_or(Span::call_site(), |a| a.span);
        return Err(syn::Error::new(
            span,
            "`ack = \"manual\"` needs a `Settle` parameter: the handler settles through it",
        ));
    }
    if let Some(span) = settle_arg
        && !manual
    {
        return Err(syn::Error::new(
            span,
            "a `Settle` parameter needs `ack = \"manual\"` on #[subscriber]",
        ));
    }
    if let (Some(f), false) = (&args.manual_fallback, manual) {
        return Err(syn::Error::new(
            f.span,
            "`manual_fallback` applies only with `ack = \"manual\"`",
        ));
    }
    if let Some(c) = &args.ack_coalescing {
        if let Some(p) = args.prefetch.as_ref().filter(|p| c.value.0 > p.value) {
            return Err(syn::Error::new(
                c.span,
                format!(
                    "`ack_coalescing`: at most `prefetch` ({}) acks can be held",
                    p.value
                ),
            ));
        }
        if args.ack.as_ref().is_some_and(|a| a.value == "ack-first") {
            return Err(syn::Error::new(
                c.span,
                "`ack_coalescing` does nothing with `ack = \"ack-first\"` (its ack is written before the handler runs)",
            ));
        }
    }
    if let (Some(d), Some(qt)) = (&args.delivery_limit, &args.queue_type)
        && qt.value != "quorum"
    {
        return Err(syn::Error::new(
            d.span,
            "`delivery_limit` applies only with `queue_type = \"quorum\"`",
        ));
    }
    if let (Some(d), None) = (&args.delivery_limit, &args.queue_type) {
        return Err(syn::Error::new(
            d.span,
            "`delivery_limit` applies only with `queue_type = \"quorum\"`",
        ));
    }
    if let (Some(r), Some(m)) = (&args.retry, &args.max_attempts)
        && r.value.is_empty()
        && m.value > 1
    {
        return Err(syn::Error::new(
            m.span,
            "`retry = []` parks on the first failure; `max_attempts` above 1 needs tiers",
        ));
    }

    let krate = args
        .krate
        .clone()
        .unwrap_or_else(|| syn::parse_quote!(::rabbitkit));
    let p = quote!(#krate::__private);
    let vis = &func.vis;
    let ident = &sig.ident;
    let fn_name = ident.to_string();
    let queue_s = &queue.value;
    let name_s = args
        .name
        .as_ref()
        .map_or(fn_name.clone(), |n| n.value.clone());

    let mut calls = Vec::<TokenStream2>::new();
    calls.push(quote!(.name(#name_s)));
    if let Some(ex) = &args.exchange {
        let e = &ex.value;
        for rk in &args.routing_keys {
            let k = &rk.value;
            calls.push(quote_spanned!(rk.span=> .bind(#e, #k)));
        }
    }
    if let Some(k) = &args.exchange_kind {
        let v = &k.value;
        calls.push(quote!(.exchange_kind(#v)));
    }
    if let Some(qt) = &args.queue_type {
        let v = format_ident!(
            "{}",
            if qt.value == "quorum" {
                "Quorum"
            } else {
                "Classic"
            }
        );
        calls.push(quote!(.queue_type(#p::QueueType::#v)));
    }
    if let Some(d) = &args.delivery_limit {
        let v = d.value;
        calls.push(quote!(.delivery_limit(#v)));
    }
    if let Some(t) = &args.tier_queue_type {
        let v = format_ident!(
            "{}",
            if t.value == "classic" {
                "Classic"
            } else {
                "Quorum"
            }
        );
        calls.push(quote!(.tier_queue_type(#p::QueueType::#v)));
    }
    if let Some(a) = &args.ack {
        let v = format_ident!(
            "{}",
            match a.value.as_str() {
                "manual" => "Manual",
                "nack-on-error" => "NackOnError",
                "ack-first" => "AckFirst",
                _ => "Auto",
            }
        );
        calls.push(quote!(.ack_policy(#p::AckPolicy::#v)));
    }
    if let Some(f) = &args.manual_fallback {
        let v = format_ident!(
            "{}",
            match f.value.as_str() {
                "auto" => "Auto",
                "ack" => "Ack",
                "reject" => "Reject",
                _ => "NackRequeue",
            }
        );
        calls.push(quote!(.manual_fallback(#p::ManualFallback::#v)));
    }
    let retry_set = args.retry.is_some()
        || args.max_attempts.is_some()
        || args.immediate_retries.is_some()
        || args.jitter.is_some()
        || !args.kinds.is_empty();
    if retry_set {
        let mut policy = match &args.retry {
            Some(r) if r.value.is_empty() => quote!(#p::RetryPolicy::none()),
            Some(r) => {
                let tiers = r.value.iter();
                quote!(#p::RetryPolicy::new([#(#p::Duration::from_nanos(#tiers)),*]))
            }
            None => quote!(<#p::RetryPolicy as ::core::default::Default>::default()),
        };
        if let Some(m) = &args.max_attempts {
            let v = m.value;
            policy = quote!(#policy.max_attempts(#v));
        }
        if let Some(i) = &args.immediate_retries {
            let v = i.value;
            policy = quote!(#policy.immediate_retries(#v));
        }
        if let Some(j) = &args.jitter {
            let v = j.value;
            policy = quote!(#policy.jitter(#v));
        }
        for k in &args.kinds {
            let name = &k.kind.value;
            let mut kp = match &k.retry {
                _ if k.park => quote!(#p::KindPolicy::park()),
                Some(t) => {
                    let t = t.iter();
                    quote!(#p::KindPolicy::tiers([#(#p::Duration::from_nanos(#t)),*]))
                }
                None => quote!(<#p::KindPolicy as ::core::default::Default>::default()),
            };
            if let Some(m) = k.max_attempts {
                kp = quote!(#kp.max_attempts(#m));
            }
            policy = quote_spanned!(k.kind.span=> #policy.on_kind(#name, #kp));
        }
        calls.push(quote!(.retry(#policy)));
    }
    if let Some(types) = &args.error_kinds {
        for t in &types.value {
            // Spanned at the type: a type that is no `ErrorKind` is reported there.
            calls.push(quote_spanned!(t.span()=> .error_kind::<#t>()));
        }
    }
    if let Some(k) = &args.adhoc_kinds {
        let names = k.value.iter();
        calls.push(quote!(.kinds([#(#names),*])));
    }
    if let Some(n) = &args.requeue_limit {
        let v = n.value;
        calls.push(quote!(.requeue_limit(#v)));
    }
    if let Some(n) = &args.prefetch {
        let v = n.value;
        calls.push(quote!(.prefetch(#v)));
    }
    if let Some(n) = &args.concurrency {
        let v = n.value;
        calls.push(quote!(.concurrency(#v)));
    }
    if let Some(d) = &args.deadline {
        let v = d.value;
        calls.push(quote!(.deadline(#p::Duration::from_nanos(#v))));
    }
    if let Some(c) = &args.ack_coalescing {
        let (n, ns) = c.value;
        calls.push(quote!(.ack_coalescing(#n, #p::Duration::from_nanos(#ns))));
    }

    // The function moves into the struct's impl, unchanged: attributes, arguments
    // (patterns included), return type and body.
    let attrs = &func.attrs;
    let docs: Vec<_> = attrs.iter().filter(|a| a.path().is_ident("doc")).collect();
    let block = &func.block;
    let inputs = &sig.inputs;
    let output = &sig.output;
    let gen_doc = format!(
        "Subscriber `{name_s}` on queue `{queue_s}`, generated by `#[subscriber]`: register it \
         with `Worker::subscribe({fn_name})`; the function is `{fn_name}::handler`."
    );
    let handler_span = ident.span();
    let handler = format_ident!("handler", span = handler_span);
    // A handler whose arguments are no extractors fails the `Handler` bound: point the
    // error at the function's name rather than at the attribute.
    let new_call = quote_spanned!(handler_span=> #p::Subscriber::new(#queue_s, Self::#handler));
    Ok(quote! {
        #(#docs)*
        #[doc = ""]
        #[doc = #gen_doc]
        #[allow(non_camel_case_types)]
        #[derive(Debug, Clone, Copy, Default)]
        #vis struct #ident;

        impl #ident {
            /// The subscriber's name (default: the function name).
            #vis const NAME: &'static str = #name_s;
            /// The work queue.
            #vis const QUEUE: &'static str = #queue_s;

            #(#attrs)*
            #vis async fn #handler(#inputs) #output #block

            /// The configured subscriber, exactly as the builder would make it.
            #vis fn subscriber() -> #p::Subscriber {
                #new_call #(#calls)*
            }
        }

        impl #p::IntoSubscriber for #ident {
            fn into_subscriber(self) -> #p::Subscriber {
                Self::subscriber()
            }
        }
    })
}
