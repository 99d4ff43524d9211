from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.archives_erased import ArchivesErased
    from ..models.contacts_erased import ContactsErased
    from ..models.events_erased import EventsErased
    from ..models.exports_erased import ExportsErased
    from ..models.inbox_erased import InboxErased
    from ..models.lake_erased import LakeErased
    from ..models.outbox_erased import OutboxErased
    from ..models.quarantine_erased import QuarantineErased
    from ..models.webhooks_erased import WebhooksErased


T = TypeVar("T", bound="ErasureStores")


@_attrs_define
class ErasureStores:
    """What was removed, store by store: `archives` are retention archives
    rewritten (their new manifest verified before the old object was
    replaced), `exports` stored export results rewritten (their job's result
    names the erasure in `erasures`), `lake` the Parquet lake (absent when
    the mirror is off).

        Attributes:
            tracked_events (EventsErased):
            inbox (InboxErased):
            contacts (ContactsErased):
            quarantine (QuarantineErased):
            outbox (OutboxErased):
            webhooks (WebhooksErased):
            archives (ArchivesErased):
            exports (ExportsErased):
            lake (LakeErased | Unset):
    """

    tracked_events: EventsErased
    inbox: InboxErased
    contacts: ContactsErased
    quarantine: QuarantineErased
    outbox: OutboxErased
    webhooks: WebhooksErased
    archives: ArchivesErased
    exports: ExportsErased
    lake: LakeErased | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        tracked_events = self.tracked_events.to_dict()

        inbox = self.inbox.to_dict()

        contacts = self.contacts.to_dict()

        quarantine = self.quarantine.to_dict()

        outbox = self.outbox.to_dict()

        webhooks = self.webhooks.to_dict()

        archives = self.archives.to_dict()

        exports = self.exports.to_dict()

        lake: dict[str, Any] | Unset = UNSET
        if not isinstance(self.lake, Unset):
            lake = self.lake.to_dict()

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "tracked_events": tracked_events,
                "inbox": inbox,
                "contacts": contacts,
                "quarantine": quarantine,
                "outbox": outbox,
                "webhooks": webhooks,
                "archives": archives,
                "exports": exports,
            }
        )
        if lake is not UNSET:
            field_dict["lake"] = lake

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.archives_erased import ArchivesErased  # noqa: PLC0415
        from ..models.contacts_erased import ContactsErased  # noqa: PLC0415
        from ..models.events_erased import EventsErased  # noqa: PLC0415
        from ..models.exports_erased import ExportsErased  # noqa: PLC0415
        from ..models.inbox_erased import InboxErased  # noqa: PLC0415
        from ..models.lake_erased import LakeErased  # noqa: PLC0415
        from ..models.outbox_erased import OutboxErased  # noqa: PLC0415
        from ..models.quarantine_erased import QuarantineErased  # noqa: PLC0415
        from ..models.webhooks_erased import WebhooksErased  # noqa: PLC0415

        d = dict(src_dict)
        tracked_events = EventsErased.from_dict(d.pop("tracked_events"))

        inbox = InboxErased.from_dict(d.pop("inbox"))

        contacts = ContactsErased.from_dict(d.pop("contacts"))

        quarantine = QuarantineErased.from_dict(d.pop("quarantine"))

        outbox = OutboxErased.from_dict(d.pop("outbox"))

        webhooks = WebhooksErased.from_dict(d.pop("webhooks"))

        archives = ArchivesErased.from_dict(d.pop("archives"))

        exports = ExportsErased.from_dict(d.pop("exports"))

        _lake = d.pop("lake", UNSET)
        lake: LakeErased | Unset
        if isinstance(_lake, Unset):
            lake = UNSET
        else:
            lake = LakeErased.from_dict(_lake)

        erasure_stores = cls(
            tracked_events=tracked_events,
            inbox=inbox,
            contacts=contacts,
            quarantine=quarantine,
            outbox=outbox,
            webhooks=webhooks,
            archives=archives,
            exports=exports,
            lake=lake,
        )

        erasure_stores.additional_properties = d
        return erasure_stores

    @property
    def additional_keys(self) -> list[str]:
        return list(self.additional_properties.keys())

    def __getitem__(self, key: str) -> Any:
        return self.additional_properties[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self.additional_properties[key] = value

    def __delitem__(self, key: str) -> None:
        del self.additional_properties[key]

    def __contains__(self, key: str) -> bool:
        return key in self.additional_properties
