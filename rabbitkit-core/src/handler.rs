//! Async functions with extractor arguments, as tower services.

use std::convert::Infallible;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll};

use crate::delivery::Delivery;
use crate::extract::{FromDelivery, Requirements};
use crate::outcome::{IntoOutcome, Outcome};

/// A boxed future of an outcome.
pub type BoxOutcomeFuture = Pin<Box<dyn Future<Output = Outcome> + Send>>;

/// An async function whose arguments are extractors and whose result converts into an
/// [`Outcome`]. Implemented for functions of up to eight arguments.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a rabbitkit handler",
    label = "not a handler",
    note = "a handler is an `async fn` of at most 8 arguments, each an extractor (`Body`, \
            `Json<T>`, `Headers`, `RoutingKey`, `MessageId`, `Attempt`, `State<T>`, `Settle`, \
            `Option<E>`, your own `FromDelivery`), that is `Send` and returns something \
            `IntoOutcome` (`()`, `Result<(), E: Into<BoxError>>`, `Outcome`)"
)]
pub trait Handler<Args>: Clone + Send + Sync + 'static {
    /// Runs the handler.
    fn call(&self, delivery: Delivery) -> BoxOutcomeFuture;

    /// What the handler's extractors need ([`FromDelivery::requirements`]).
    fn requirements(&self) -> Requirements {
        Requirements::default()
    }
}

macro_rules! impl_handler {
    ($($t:ident),*) => {
        #[allow(non_snake_case, unused_variables)]
        impl<F, Fut, R, $($t,)*> Handler<($($t,)*)> for F
        where
            F: Fn($($t),*) -> Fut + Clone + Send + Sync + 'static,
            Fut: Future<Output = R> + Send + 'static,
            R: IntoOutcome,
            $($t: FromDelivery + Send + 'static,)*
        {
            fn call(&self, delivery: Delivery) -> BoxOutcomeFuture {
                $(
                    let $t = match $t::from_delivery(&delivery) {
                        Ok(v) => v,
                        Err(rejection) => {
                            let outcome: Outcome = rejection.into();
                            return Box::pin(std::future::ready(outcome));
                        }
                    };
                )*
                let fut = (self)($($t),*);
                Box::pin(async move { fut.await.into_outcome() })
            }

            fn requirements(&self) -> Requirements {
                #[allow(unused_mut)]
                let mut r = Requirements::default();
                $( $t::requirements(&mut r); )*
                r
            }
        }
    };
}

impl_handler!();
impl_handler!(T1);
impl_handler!(T1, T2);
impl_handler!(T1, T2, T3);
impl_handler!(T1, T2, T3, T4);
impl_handler!(T1, T2, T3, T4, T5);
impl_handler!(T1, T2, T3, T4, T5, T6);
impl_handler!(T1, T2, T3, T4, T5, T6, T7);
impl_handler!(T1, T2, T3, T4, T5, T6, T7, T8);

/// A [`Handler`] as a tower `Service<Delivery, Response = Outcome>`.
#[derive(Debug)]
pub struct HandlerService<H, Args> {
    handler: H,
    _args: PhantomData<fn() -> Args>,
}

impl<H: Clone, Args> Clone for HandlerService<H, Args> {
    fn clone(&self) -> Self {
        Self {
            handler: self.handler.clone(),
            _args: PhantomData,
        }
    }
}

/// Wraps a handler function as a tower service.
pub fn handler_service<H, Args>(handler: H) -> HandlerService<H, Args>
where
    H: Handler<Args>,
{
    HandlerService {
        handler,
        _args: PhantomData,
    }
}

impl<H, Args> tower::Service<Delivery> for HandlerService<H, Args>
where
    H: Handler<Args>,
{
    type Response = Outcome;
    type Error = Infallible;
    type Future = HandlerFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, d: Delivery) -> HandlerFuture {
        HandlerFuture(self.handler.call(d))
    }
}

/// The future of a [`HandlerService`].
pub struct HandlerFuture(BoxOutcomeFuture);

impl std::fmt::Debug for HandlerFuture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HandlerFuture")
    }
}

impl Future for HandlerFuture {
    type Output = Result<Outcome, Infallible>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.0.as_mut().poll(cx).map(Ok)
    }
}
