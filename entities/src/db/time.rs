//! [`Time`]: an instant in a record. PostgreSQL stores it as `timestamptz`;
//! SQLite as integer microseconds since the epoch (sortable, and the layout
//! every released database has). A value is bound as an instant and the
//! store's SQLite connection turns bound instants into microseconds, so a
//! query is written once; reading looks at which backend the row came from.

use chrono::{DateTime, TimeZone, Utc};
use sea_orm::{
    ColIdx, QueryResult, TryGetError, TryGetable, Value,
    sea_query::{ArrayType, ColumnType, Nullable, ValueType, ValueTypeErr},
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Time(pub DateTime<Utc>);

impl From<DateTime<Utc>> for Time {
    fn from(t: DateTime<Utc>) -> Self {
        Time(t)
    }
}

impl From<Time> for DateTime<Utc> {
    fn from(t: Time) -> Self {
        t.0
    }
}

impl From<Time> for Value {
    fn from(t: Time) -> Value {
        Value::ChronoDateTimeUtc(Some(t.0))
    }
}

impl TryGetable for Time {
    fn try_get_by<I: ColIdx>(res: &QueryResult, idx: I) -> Result<Self, TryGetError> {
        if res.try_as_sqlite_row().is_some() {
            let micros = i64::try_get_by(res, idx)?;
            Utc.timestamp_micros(micros)
                .single()
                .map(Time)
                .ok_or_else(|| {
                    TryGetError::DbErr(sea_orm::DbErr::Type(format!("timestamp {micros}")))
                })
        } else {
            DateTime::<Utc>::try_get_by(res, idx).map(Time)
        }
    }
}

impl ValueType for Time {
    fn try_from(v: Value) -> Result<Self, ValueTypeErr> {
        match v {
            Value::ChronoDateTimeUtc(Some(t)) => Ok(Time(t)),
            Value::BigInt(Some(micros)) => Utc
                .timestamp_micros(micros)
                .single()
                .map(Time)
                .ok_or(ValueTypeErr),
            _ => Err(ValueTypeErr),
        }
    }

    fn type_name() -> String {
        "Time".to_owned()
    }

    fn array_type() -> ArrayType {
        ArrayType::ChronoDateTimeUtc
    }

    fn column_type() -> ColumnType {
        ColumnType::TimestampWithTimeZone
    }
}

impl Nullable for Time {
    fn null() -> Value {
        Value::ChronoDateTimeUtc(None)
    }
}

impl sea_orm::IntoActiveValue<Time> for Time {
    fn into_active_value(self) -> sea_orm::ActiveValue<Time> {
        sea_orm::ActiveValue::Set(self)
    }
}
