use rabbitkit::prelude::*;

struct S;

impl S {
    #[subscriber(queue = "orders")]
    async fn orders(&self, Body(_b): Body) -> Result<(), BoxError> {
        Ok(())
    }
}

fn main() {}
