async fn capture_payment(
    store: &impl ::idem_runtime::__private::LeaseStore,
    msg: &PaymentCaptured,
) -> ::idem_runtime::__private::Result<
    ::idem_runtime::__private::Outcome<Receipt>,
    ::idem_runtime::__private::Error<GatewayError>,
> {
    use ::idem_runtime::__private::stores::names::redis as __idem_store;
    __idem_store::<::idem_runtime::__private::stores::LeaseMode>();
    const __IDEM_SPEC: ::idem_runtime::__private::HandlerSpec = ::idem_runtime::__private::HandlerSpec {
        name: "capture_payment",
        function: "capture_payment",
        key: "payment_id",
        ttl: ::idem_runtime::__private::Duration::from_millis(604800000u64),
        lease: ::idem_runtime::__private::Duration::from_millis(30000u64),
        store: "redis",
        mode: ::idem_runtime::__private::Mode::Lease,
        module: ::core::module_path!(),
        file: ::core::file!(),
        line: ::core::line!(),
        fingerprint: ::core::option::Option::Some("amount + currency"),
        max_attempts: ::core::option::Option::Some(3u32),
    };
    ::idem_runtime::__private::inventory::submit! {
        __IDEM_SPEC
    }
    let __idem_codec = ::idem_runtime::__private::codec::<Receipt>();
    let __idem_errors = {
        #[allow(unused_imports)]
        use ::idem_runtime::__private::{
            DisplayText as _, FinalErrors as _, NoFinalErrors as _, NoText as _,
        };
        ::idem_runtime::__private::ErrorCodec::<
            GatewayError,
        >::new(
            (&::idem_runtime::__private::ErrorProbe::<GatewayError>::new()).idem_final(),
            (&::idem_runtime::__private::ErrorProbe::<GatewayError>::new()).idem_text(),
        )
    };
    let __idem_key: ::idem_runtime::__private::Key = {
        use ::idem_runtime::__private::{AnyProbe as _, FloatProbe as _};
        let mut __idem_builder = ::idem_runtime::__private::KeyBuilder::new();
        if __idem_builder
            .part(
                (&::idem_runtime::__private::KeyPartProbe(&(msg).payment_id))
                    .idem_key_part()
                    .get(),
            )
            .is_err()
        {
            return ::idem_runtime::__private::key_missing(&__IDEM_SPEC, "payment_id");
        }
        __idem_builder.finish()
    };
    let __idem_fingerprint: ::idem_runtime::__private::Option<
        ::idem_runtime::__private::String,
    > = ::idem_runtime::__private::Option::Some(
        ::idem_runtime::__private::fingerprint(
            &(
                ::idem_runtime::__private::fingerprint_part(&(msg).amount),
                ::idem_runtime::__private::fingerprint_part(&(msg).currency),
            ),
        ),
    );
    let __idem_body = async move {
        #[allow(
            unknown_lints,
            unreachable_code,
            clippy::diverging_sub_expression,
            clippy::empty_loop,
            clippy::let_unit_value,
            clippy::let_with_type_underscore,
            clippy::needless_return,
            clippy::unreachable
        )]
        if false {
            let __idem_fake_return: Result<Receipt, GatewayError> = loop {};
            return __idem_fake_return;
        }
        gateway::capture(msg.payment_id, msg.amount, &msg.currency).await
    };
    ::idem_runtime::__private::run_lease::<
        _,
        Receipt,
        GatewayError,
        _,
    >(
            store,
            &__IDEM_SPEC,
            &__idem_key,
            __idem_fingerprint.as_deref(),
            __idem_codec,
            __idem_errors,
            __idem_body,
        )
        .await
}
