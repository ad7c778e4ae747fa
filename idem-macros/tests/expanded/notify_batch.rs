async fn notify(
    store: &impl ::idem_runtime::__private::LeaseStore,
    msgs: &[OrderShipped],
) -> ::idem_runtime::__private::Result<
    ::idem_runtime::__private::Results<SmsId, GatewayError>,
    ::idem_runtime::__private::Error<GatewayError>,
> {
    use ::idem_runtime::__private::stores::names::redis as __idem_store;
    __idem_store::<::idem_runtime::__private::stores::LeaseMode>();
    const __IDEM_SPEC: ::idem_runtime::__private::HandlerSpec = ::idem_runtime::__private::HandlerSpec {
        name: "notify",
        function: "notify",
        key: "order_id",
        ttl: ::idem_runtime::__private::Duration::from_millis(259200000u64),
        lease: ::idem_runtime::__private::Duration::from_millis(30000u64),
        store: "redis",
        mode: ::idem_runtime::__private::Mode::Lease,
        module: ::core::module_path!(),
        file: ::core::file!(),
        line: ::core::line!(),
        fingerprint: ::core::option::Option::Some("phone"),
        max_attempts: ::core::option::Option::None,
    };
    ::idem_runtime::__private::inventory::submit! {
        __IDEM_SPEC
    }
    let __idem_codec = ::idem_runtime::__private::codec::<SmsId>();
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
    let __idem_derived = {
        let mut __idem_all: ::idem_runtime::__private::Vec<
            ::idem_runtime::__private::Derived<GatewayError>,
        > = ::idem_runtime::__private::Vec::with_capacity(msgs.len());
        for __idem_msg in msgs {
            __idem_all
                .push('__idem_derive: {
                    let __idem_key: ::idem_runtime::__private::Key = {
                        use ::idem_runtime::__private::{AnyProbe as _, FloatProbe as _};
                        let mut __idem_builder = ::idem_runtime::__private::KeyBuilder::new();
                        if __idem_builder
                            .part(
                                (&::idem_runtime::__private::KeyPartProbe(
                                    &(__idem_msg).order_id,
                                ))
                                    .idem_key_part()
                                    .get(),
                            )
                            .is_err()
                        {
                            let __idem_missing: ::idem_runtime::__private::Derived<
                                GatewayError,
                            > = ::idem_runtime::__private::Result::Err(::idem_runtime::__private::Error::KeyMissing {
                                handler: __IDEM_SPEC.name,
                                part: "order_id",
                            });
                            break '__idem_derive __idem_missing;
                        }
                        __idem_builder.finish()
                    };
                    ::idem_runtime::__private::Result::Ok((
                        __idem_key,
                        ::idem_runtime::__private::Option::Some(
                            ::idem_runtime::__private::fingerprint(
                                &(
                                    ::idem_runtime::__private::fingerprint_part(
                                        &(__idem_msg).phone,
                                    ),
                                ),
                            ),
                        ),
                    ))
                });
        }
        __idem_all
    };
    ::idem_runtime::__private::batch_message::<OrderShipped>();
    let __idem_batch = {
        #[allow(unused_imports)]
        use ::idem_runtime::__private::{AnyBatch as _, CloneBatch as _};
        (&::idem_runtime::__private::BatchProbe::<OrderShipped>::new()).idem_batch()
    };
    __idem_batch
        .run_lease::<
            _,
            SmsId,
            GatewayError,
            _,
            _,
        >(
            store,
            &__IDEM_SPEC,
            msgs,
            __idem_derived,
            __idem_codec,
            __idem_errors,
            move |__idem_fresh| async move {
                let msgs: &[OrderShipped] = &*__idem_fresh;
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
                    let __idem_fake_return: Result<Vec<SmsId>, GatewayError> = loop {};
                    return __idem_fake_return;
                }
                sms::send_all(msgs.iter().map(|m| (&m.phone, "Your order has shipped")))
                    .await
            },
        )
        .await
}
