#include "outbox/delivery_result.hpp"

#include "outbox/errors.hpp"

namespace outbox {

DeliveryResult DeliveryResult::from_exception(std::exception_ptr error) {
  DeliveryResult result;
  try {
    std::rethrow_exception(error);
  } catch (const UnroutableEventError& e) {
    result = {.kind = Kind::Unroutable, .message = e.what()};
  } catch (const PermanentFailure& e) {
    result = permanent(e.what());
  } catch (const RetryLater& e) {
    result = retry_later(e.delay(), e.what(), e.count_attempt());
  } catch (const std::exception& e) {
    result = failed(e.what());
  } catch (...) {
    result = failed("non-standard exception");
  }
  result.exception = std::move(error);
  return result;
}

}  // namespace outbox
