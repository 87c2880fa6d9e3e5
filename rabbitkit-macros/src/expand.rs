//! The code the attribute generates, and the stand-in it generates on an error.

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as TokenStream2};
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{FnArg, ItemFn, Type};

use crate::attr::Args;

/// A compile error plus the function as written, so that one mistake in the attribute
/// does not turn every use of the function into a second error.
pub(crate) fn with_original(e: syn::Error, item: TokenStream2) -> TokenStream {
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
pub(crate) fn with_stand_in(e: syn::Error, args: &Args, func: &ItemFn) -> TokenStream {
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

/// Whether an argument's type is the manual-settlement handle (`Settle`, by any path).
fn is_settle(ty: &Type) -> bool {
    match ty {
        Type::Path(p) => p.path.segments.last().is_some_and(|s| s.ident == "Settle"),
        Type::Paren(p) => is_settle(&p.elem),
        Type::Group(g) => is_settle(&g.elem),
        _ => false,
    }
}

pub(crate) fn expand(args: Args, func: ItemFn) -> syn::Result<TokenStream2> {
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
