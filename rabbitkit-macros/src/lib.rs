//! The `#[subscriber]` attribute of [rabbitkit](https://docs.rs/rabbitkit).
//!
//! Use it through the facade: `use rabbitkit::subscriber;`. Everything it generates is
//! plain builder code (`Subscriber::new(..).bind(..).retry(..)`) reached through the
//! facade's hidden `__private` path; see the facade's documentation for the keys.

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as TokenStream2};
use syn::ItemFn;
use syn::parse::Parser;

mod attr;
mod expand;

use attr::{Args, At};
use expand::{expand, with_original, with_stand_in};

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
