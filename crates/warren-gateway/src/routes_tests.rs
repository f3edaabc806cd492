//! A method a path does not take: 405 with the API's JSON error and an `Allow` header naming
//! the methods the path does take, on every path the gateway serves (as on a node; the check
//! is `warren_testkit::routes`).

use warren_cluster::{ClusterView, View};

use crate::{Gateway, GatewayConfig};

#[tokio::test]
async fn a_wrong_method_is_405_with_allow_on_every_path() {
    let gw = Gateway::new(
        GatewayConfig::default(),
        ClusterView::fixed(View::default()),
    );
    let tried =
        warren_testkit::routes::wrong_methods_answer_405(gw.router(), super::routes()).await;
    assert!(tried > 100, "only {tried} wrong methods tried");
}
