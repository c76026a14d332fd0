# frozen_string_literal: true

# rails.rb: one line per endpoint in a Rails controller.
#
#   class PaymentsController < ApplicationController
#     idempotent :create, scope: "payments"
#     def create
#       payment = Payment.create!(amount: params[:amount])     # with the key
#       render json: payment, status: :created, location: payment
#     end
#   end
#
# `idempotent *actions, **options` is an around_action: it begins the key
# inside `ActiveRecord::Base.transaction(requires_new: true)` on the
# request's ActiveRecord connection, runs the action in it (its model
# writes join that transaction), and stores the rendered response with the
# key before the transaction commits; a replay is rendered without running
# the action.  An exception in the action rolls everything back and goes on
# to rescue_from / Rails' 500 page (not stored).  The action's
# #idempotency is the PgIdempotency::Context.  Under PgBouncer in transaction
# mode set prepared_statements: false in database.yml.
#
# Phases (lease mode, resumable): in the action,
#   phased scope: "transfers", lease_seconds: 2 do |p|
#     p.phase("debit") { |ctx| Transfer.create!(...) }   # its own transaction
#     p.external("charge") { |ctx| ... }                 # no transaction open
#     p.respond { |state| [201, { "Content-Type" => "application/json" }, body] }
#   end
require "active_support"
require_relative "core"
require_relative "guard"
require_relative "active_record"
require_relative "phased"

module PgIdempotency
  module Rails
    module Controller
      extend ActiveSupport::Concern

      class_methods do
        # idempotent(*actions, scope:, model: ActiveRecord::Base, **options):
        # no actions: every action of the controller.  model: the
        # ActiveRecord class whose connection guards (a second database).
        def idempotent(*actions, scope:, model: nil, **options)
          if defined?(::ActionController::Live) && self <= ::ActionController::Live
            raise ArgumentError, "idempotent: #{name} streams (ActionController::Live): " \
                                 "a streamed response cannot be stored for replay"
          end
          guard = Guard.new(Options.new(scope: scope, **options))
          transactions = ActiveRecordTransactions.new(model || ::ActiveRecord::Base)
          filter = actions.empty? ? {} : { only: actions }
          around_action(**filter) do |controller, action|
            controller.send(:idempotency_around, guard, transactions, action)
          end
        end
      end

      # the guarded request's PgIdempotency::Context (nil when unguarded)
      def idempotency
        @_idempotency
      end

      # phased(scope:, model: ActiveRecord::Base, **options) { |p| ... }: the
      # action's phases under its Idempotency-Key in lease mode, each
      # database phase in model.transaction on ActiveRecord's connection
      # (its model writes commit with its checkpoint), answered with the
      # guard's HTTP rules (PgIdempotency::PhasedRoute); p.respond returns
      # [status, headers, body], which is rendered
      def phased(model: nil, **options, &block)
        route = PhasedRoute.new(model || ::ActiveRecord::Base, **options)
        idempotency_render(route.call(request, &block))
      end

      private

      def idempotency_around(guard, transactions, action)
        o = guard.options
        begin
          key = PgIdempotency.parse_key(request.get_header("HTTP_IDEMPOTENCY_KEY"))
        rescue InvalidKey => e
          return idempotency_render(PgIdempotency.invalid_key(e.message))
        end
        if key.nil?
          return action.call unless o.required

          return idempotency_render(PgIdempotency.missing_key)
        end
        scope = o.scope_for(request)
        fingerprint = o.request ? o.request.call(request) : PgIdempotency.request_json(
          request.request_method, request.original_fullpath, request.raw_post.to_s.b
        )
        answer = guard.run(transactions, key, scope, fingerprint) do |context|
          @_idempotency = context
          action.call
          idempotency_captured
        end
        idempotency_render(answer) if answer
      end

      # the rendered response; a streamed one (send_file, an Enumerator
      # body) is refused
      def idempotency_captured
        body = response_body
        unless body.is_a?(Array) && body.all? { |part| part.is_a?(String) }
          raise UnstorableResponse, "a streamed response body (#{body.class}) cannot be stored for replay"
        end

        Captured.new(response.status, ->(name) { PgIdempotency.header(response.headers, name) }, body.join.b)
      end

      def idempotency_render(answer)
        # an answer in place of one the action rendered: none of its headers
        response.headers.delete("Location")
        response.status = answer.status
        answer.headers.each { |name, value| response.set_header(name, value) }
        response.set_header("Idempotent-Replayed", "true") if answer.replayed
        self.response_body = [answer.body]
      end
    end
  end
end

# `idempotent` is a class method of every controller (ActionController::Base
# and ::API), at once when they are loaded already, else when they load.
ActiveSupport.on_load(:action_controller) { include PgIdempotency::Rails::Controller }
