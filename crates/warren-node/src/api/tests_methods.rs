//! A method a path does not take: 405 with the API's JSON error and an `Allow` header naming
//! the methods the path does take, on every path of [`super::ROUTES`] (as on a gateway; the
//! check is `warren_testkit::routes`).

use crate::testing::manager_in;

#[tokio::test]
async fn a_wrong_method_is_405_with_allow_on_every_path() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _) = manager_in(dir.path(), |_| {});
    let app = super::router(crate::Node::new(m, None));
    let tried =
        warren_testkit::routes::wrong_methods_answer_405(app, super::ROUTES.iter().copied()).await;
    assert!(tried > 100, "only {tried} wrong methods tried");
}
